"""What reports an event: the small interface the fault injector and the checkpointer report through.

`ftplane.trainer.sdk.Run` implements it (through the node agent); a test passes anything with the same two
methods. Standard library only, and importing nothing else of the SDK, so that trainer/faults.py and
trainer/checkpoint.py can name it without pulling the SDK in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from ftplane.contract import EventType


class EventSink(Protocol):
    def event(
        self,
        type: EventType,
        details: Mapping[str, Any] | None = None,
        *,
        step: int | None = None,
        key: str | None = None,
        rank: int | None = None,
    ) -> str:
        """Queue an event (never waits on anything); returns its idempotency key."""
        ...

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s until what is queued has left this process; True if it has."""
        ...


def checkpoint_saved_details(
    step: int, *, blocking_s: float, total_s: float, bytes: int | None, **extra: Any
) -> dict[str, Any]:
    """A `checkpoint_saved` event's details: what goodput reads (the stall is `blocking_s` of the save's
    `total_s`, ending `total_s` after it started), then anything else the saver adds."""
    details: dict[str, Any] = {"step": step, "blocking_s": round(blocking_s, 4), "total_s": round(total_s, 4)}
    if bytes is not None:
        details["bytes"] = bytes
    return {**details, **extra}
