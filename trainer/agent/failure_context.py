"""A failure's context: the last lines of the failed rank's output travel with its `rank_failed`, and the
round's root cause (the one `contract.root_cause` picks) carries its tail into the in-job restart.

ft_launcher says a rank failed before its tee has copied the rank's last lines (the traceback) to
its output; it has copied them all when it says the worker group restarts, or exits. So a rank's
failure is held until its round's end (the group restart, or the end of the launcher's output), at
most MAX_HOLD_S, then reported, in the order the launcher said them, with the last lines the rank
printed in that round. For a rank that exited with a status (not a signal) and printed a Python
traceback, the exception is the cause: `raised ValueError: ... (exit code 1)`, class `exception`.
An exception saying the rank's collective broke because a peer went away (`contract.collective_broken`:
gloo's "Connection closed by peer", NCCL's remote errors; for a rank aborted by SIGABRT, NCCL's watchdog
in its last lines) marks the failure a `consequence`, as the SDK marks its own (trainer/sdk/failures.py):
the round's root cause is a failure that is none. The launcher often names only the first rank to exit,
which is the one whose collective broke as often as the one that failed; when every failure it named in a
round is a consequence, a rank of this node whose last lines in that round end in an exception of its own
is the round's cause (ranks in order of their number, when several did).
What the agent adds to a fact as the launcher says it (`hold(fact, facts)`: a failure's step and whether it
is a peer's consequence, the step a round reached) goes into its event; `on_reported` runs after each report.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ftplane import contract
from ftplane.contract import EventType, collective_broken
from ftplane.trainer.agent.launcher_output import GroupRestarted, RankExit, RankFailed, round_cause, silence_cause
from ftplane.trainer.agent.rank_logs import RankLogs
from ftplane.trainer.agent.tracebacks import exception_in
from ftplane.trainer.agent.uplink import NodeEvents

log = logging.getLogger(__name__)

MAX_HOLD_S = 2.0  # a launcher that never says the round ended

Held = RankFailed | GroupRestarted
Facts = Mapping[str, Any]  # added to a held fact's event: `step` its step, the rest its details
MARKS = ("consequence", "consequence_of")  # what the agent adds to a failure that its round's cause reads


def with_tail(cause: dict[str, Any], lines: list[str]) -> dict[str, Any]:
    """A rank failure's cause (event details) with the rank's last lines, and the exception it raised if any;
    marked `consequence` when they say its collective broke because a peer went away."""
    if not lines:
        return cause
    out = {**cause, "tail": contract.tail_text(lines)}
    code = cause.get("exit_code")
    if isinstance(code, int) and code > 0 and not cause.get("silent_s"):
        raised = exception_in(lines)
        if raised is not None:
            out.update(exception=raised, cause_class="exception", cause=f"raised {raised} ({cause['cause']})")
            if collective_broken(raised):
                out["consequence"] = True  # a peer's failure broke this rank's collective: that failure is the cause
    elif cause.get("signal") == "SIGABRT" and any(collective_broken(line) for line in lines):
        out["consequence"] = True  # NCCL's watchdog aborts a rank whose collective a peer's exit left waiting
    return out


def as_round_ended(held: Held, final: Mapping[int, RankExit]) -> Held:
    """A held fact as its round's end tells it: a failure with what the launcher said of it since."""
    if isinstance(held, RankFailed) and held.failure.pid in final:
        return RankFailed(held.round, final[held.failure.pid])
    return held


def raised_in(rank: int, lines: list[str]) -> dict[str, Any] | None:
    """The cause of a rank the launcher did not name (event details), from its last lines: an exception of its
    own (not a broken collective's), else None."""
    raised = exception_in(lines)
    if raised is None or collective_broken(raised):
        return None
    return {
        "cause": f"rank {rank} raised {raised}",
        "cause_class": "exception",
        "exception": raised,
        "rank": rank,
        "tail": contract.tail_text(lines),
    }


class FailureContext:
    """Reports the launcher's failure facts at their round's end, in order, with the failed ranks' tails.

    `injected(round)`: the cause of a crash the agent itself injected in that round, if any (what it did is
    known, whichever rank the launcher happened to see die first).
    """

    def __init__(
        self,
        uplink: NodeEvents,
        job_id: str | None,
        logs: RankLogs,
        injected: Callable[[int], dict[str, Any] | None],
        max_hold_s: float = MAX_HOLD_S,
        on_reported: Callable[[], None] | None = None,
    ) -> None:
        self.uplink = uplink
        self.job_id = job_id
        self.logs = logs
        self.injected = injected
        self.max_hold_s = max_hold_s
        self.on_reported = on_reported
        self._held: list[tuple[float, Held, Facts]] = []
        self._causes: dict[int, dict[str, Any]] = {}  # pid -> its failure's cause, tail and marks included
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ftplane-failure-context", daemon=True)
        self._thread.start()

    def hold(self, fact: Held, facts: Facts | None = None) -> None:
        """Called as the launcher's output says it (the reader's thread): a group restart ends its round, whose
        output is all out: the ranks' lines from now on are the next cycle's, and what is held is due."""
        now = time.monotonic()
        with self._cond:
            if isinstance(fact, GroupRestarted):
                self.logs.new_cycle(fact.restart_count)
                final = {failure.pid: failure for failure in fact.failures}  # silence a monitor said late included
                self._held = [(now, as_round_ended(held, final), added) for _, held, added in self._held]
                self._held.append((now, fact, facts or {}))
            else:
                self._held.append((now + self.max_hold_s, fact, facts or {}))
            self._cond.notify()

    def close(self) -> None:
        """Report everything held now (the launcher's output is over) and stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._held or self._held[0][0] > time.monotonic()):
                    self._cond.wait(timeout=self._held[0][0] - time.monotonic() if self._held else None)
                due, self._held = (self._held, []) if self._closed else (self._held[:1], self._held[1:])
                closed = self._closed
            for _, fact, facts in due:
                try:
                    self._report(fact, facts)
                    if self.on_reported is not None:
                        self.on_reported()
                except Exception:
                    log.exception("reporting a failure of the launcher's output failed")
            if closed:
                return

    def _report(self, fact: Held, facts: Facts) -> None:
        if isinstance(fact, RankFailed):
            self._rank_failed(fact, facts)
        else:
            self._restarted(fact, facts)

    def _rank_failed(self, fact: RankFailed, facts: Facts) -> None:
        failure = fact.failure
        lines = self.logs.tail(failure.rank, fact.round) if failure.rank is not None else []
        cause = with_tail(failure.cause(), lines)
        added = {k: v for k, v in facts.items() if k != "step"}
        self._causes[failure.pid] = {**cause, **{k: added[k] for k in MARKS if k in added}}
        self.uplink.event(
            EventType.rank_failed,
            rank=failure.rank,
            step=facts.get("step"),
            key=self._exit_key(failure.pid),
            details={**cause, **added, "source": "launcher", "round": fact.round},
        )

    def _restarted(self, fact: GroupRestarted, facts: Facts) -> None:
        round_ = fact.restart_count - 1
        injected = self.injected(round_)
        if injected is not None and isinstance(injected.get("rank"), int):
            injected = with_tail(injected, self.logs.tail(injected["rank"], round_))
        cause = injected or self._round_cause(fact)
        if injected is not None and isinstance(pid := injected.get("pid"), int) and pid not in self._causes:
            # The launcher names only the first exit of a round, often a peer's broken collective: the rank this
            # agent crashed itself still gets its `rank_failed` (the same key as the launcher's would have).
            self._causes[pid] = injected
            self.uplink.event(
                EventType.rank_failed,
                rank=injected["rank"],
                step=facts.get("step"),
                key=self._exit_key(pid),
                details={**injected, "source": "launcher", "round": round_},
            )
        # Every node's agent reports the restart under one key: stored once, the first wins.
        self.uplink.event(
            EventType.injob_restart,
            key=contract.injob_restart_key(self.job_id, self.uplink.attempt, fact.restart_count),
            step=facts.get("step"),
            details={
                **cause,
                **{k: v for k, v in facts.items() if k != "step"},
                "restart_count": fact.restart_count,
                "attempts_left": fact.attempts_left,
                "source": "launcher",
            },
        )

    def _exit_key(self, pid: int) -> str:
        return f"agent:{self.uplink.node}:a{self.uplink.attempt}:pid{pid}:exit"

    def _round_cause(self, fact: GroupRestarted) -> dict[str, Any]:
        """The round's root cause among the failures the launcher named; when none of them was killed for silence
        but a rank's monitor said it was silent, that rank (the first); when all of them are consequences (or it
        named none), a rank of this node that raised an exception of its own in the round."""
        failures, round_ = list(fact.failures), fact.restart_count - 1
        cause = round_cause(failures, self._cause_of)
        if cause.get("cause_class") != "hang" and fact.silent:
            rank, silent_s = next(iter(fact.silent.items()))
            return with_tail(silence_cause(rank, silent_s), self.logs.tail(rank, round_))
        if failures and cause.get("consequence") is not True:
            return cause
        named = {f.rank for f in failures}
        for rank in self.logs.ranks():
            found = raised_in(rank, self.logs.tail(rank, round_)) if rank not in named else None
            if found is not None:
                return found
        return cause

    def _cause_of(self, failure: RankExit) -> dict[str, Any]:
        return self._causes.get(failure.pid) or failure.cause()
