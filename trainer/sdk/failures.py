"""What a rank's exception says as a failure: its cause, and whether it is a failure of this rank at all."""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from types import TracebackType
from typing import Any

from ftplane.contract import collective_broken

log = logging.getLogger("ftplane.trainer.sdk")

MAX_EXCEPTION_CHARS = 4000
MAX_CAUSE_CHARS = 500


def is_restart_signal(exc: BaseException) -> bool:
    """NVRx's Wrapper interrupting a healthy rank because another failed: not this rank's failure."""
    if "nvidia_resiliency_ext" not in sys.modules:
        return False  # nothing of NVRx is loaded, so nothing raised by it
    from ftplane.trainer.nvrx import inprocess_restart

    return inprocess_restart.is_restart_signal(exc)


def exception_cause(exc: BaseException) -> dict[str, Any]:
    """The cause of a rank's failure by `exc` (a `rank_failed` event's details, cause_class `exception`), marked
    `consequence` when it says the rank's collective broke because a peer went away (ftplane/contract.py)."""
    text = "".join(traceback.format_exception_only(exc)).strip()
    message = str(exc).strip().splitlines()
    cause = (f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__)[:MAX_CAUSE_CHARS]
    facts: dict[str, Any] = {
        "cause": cause,
        "cause_class": "exception",
        "exception_type": type(exc).__name__,
        "exception": text[:MAX_EXCEPTION_CHARS],
    }
    if collective_broken(text):
        facts["consequence"] = True  # a peer's failure broke this rank's collective: that failure is the cause
    return facts


class UncaughtExceptions:
    """`sys.excepthook` that reports an exception ending the script through `report` (a KeyboardInterrupt
    is no failure), then runs the hook it replaced."""

    def __init__(self, report: Callable[[BaseException], object]) -> None:
        self.report = report
        self.previous: Callable[..., Any] | None = None

    def install(self) -> None:
        if self.previous is None:
            self.previous = sys.excepthook
            sys.excepthook = self

    def uninstall(self) -> None:
        if self.previous is not None and sys.excepthook is self:
            sys.excepthook = self.previous

    def __call__(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            try:
                self.report(exc)
            except Exception:  # reporting must never hide the original error
                log.exception("reporting the uncaught exception failed")
        (self.previous or sys.__excepthook__)(exc_type, exc, tb)
