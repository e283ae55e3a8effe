"""Waiting on a condition with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, condition: Callable[[], Any], timeout: float = 60.0, interval: float = 0.1) -> Any:
    """Poll until `condition()` is truthy and return its value; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
