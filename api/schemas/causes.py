"""Why something failed, structured where it is known: a bounded class plus the facts.

Whoever creates a failure, restart or end event states its cause as a `Cause`: the class
(`crash`, `hang`, ...) and the facts that go with it (rank, exit code, signal, silent seconds).
Its `details()` are what the event carries: `cause` (the sentence people read), `cause_class`,
and each fact under its own key. Metrics, goodput and webhooks read those fields; nothing
downstream parses the sentence.

Senders outside the control plane (the trainer, the node agent) write the same keys over HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class CauseClass(StrEnum):
    crash = "crash"  # a process ended abnormally: exit code, signal, OOM kill
    hang = "hang"  # a rank stopped heartbeating (or was killed for it)
    exception = "exception"  # the training code raised
    node = "node"  # a node was lost or found unhealthy
    preempted = "preempted"  # evicted, drained, spot interruption: not the job's fault
    straggler = "straggler"  # a rank kept the job slow
    scheduling = "scheduling"  # the attempt could not be placed or started (pending timeout)
    launch = "launch"  # the backend refused or failed to start the attempt
    no_progress = "no_progress"  # restarts that never got past the same step
    verdict = "verdict"  # the resiliency library itself decided not to restart
    cancelled = "cancelled"  # an operator asked for it
    other = "other"  # known, but none of the above
    unknown = "unknown"  # no cause was given


# Facts a cause may carry, each a key of its own in an event's details. A rank's failure also carries the last
# lines it printed (`tail`, redacted on its node) and, read from them, the exception it raised (`exception`).
FACT_KEYS = ("rank", "node", "exit_code", "signal", "silent_s", "pid", "reason", "exception", "tail")


@dataclass(frozen=True)
class Cause:
    cause_class: CauseClass
    message: str
    facts: Mapping[str, Any] = field(default_factory=dict)

    def details(self) -> dict[str, Any]:
        """The fields an event stores for this cause."""
        return {"cause": self.message, "cause_class": self.cause_class.value, **self.facts}

    def with_message(self, message: str) -> Cause:
        """The same class and facts, said differently (e.g. with what the supervisor decided)."""
        return Cause(self.cause_class, message, self.facts)

    @classmethod
    def of(cls, details: Mapping[str, Any] | None) -> Cause:
        """Read back what `details()` wrote (unknown when an event carries no cause)."""
        details = details or {}
        return cls(
            cause_class_of(details),
            str(details.get("cause") or ""),
            {k: details[k] for k in FACT_KEYS if k in details},
        )


def cause_class_of(details: Mapping[str, Any] | None) -> CauseClass:
    """The stated class of an event's cause: `unknown` when none is stated, `other` when it is not one of ours."""
    value = (details or {}).get("cause_class")
    if value is None:
        return CauseClass.unknown
    try:
        return CauseClass(value)
    except ValueError:
        return CauseClass.other


def describe_exit(code: int) -> str:
    """An exit status in words: a negative one is the signal that ended the process."""
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return f"exit code {code}"


def signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
