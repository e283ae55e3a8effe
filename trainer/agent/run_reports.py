"""What the node agent says of each run of its ranks (one launcher round): that it runs, where it began and how
far it got, for ranks that do not say so themselves; and the order in which its ranks' failures are reported.

`running`, said twice by the agent for each round, facts of different kinds (goodput reads both, and
leaves both out where the ranks' SDK said `running` itself):

- as soon as the round's rank processes are up (seen within one report interval of their start):
  details.basis "processes", no start step. It is what moves the job to RUNNING, for every job, SDK
  or not, and after every restart;
- once the ranks' output says where the run began (line_progress.py: a preset's resume line, or the
  first step read): details.basis "progress", with the step it resumed from where the output says it
  (else none, never a guess). Goodput starts the run's productive time there.

A rank's failure that is the consequence of a peer's (its collective broke when the peer died:
`ftplane.contract.collective_broken`, marked by the SDK) is held back until the launcher reports the
failures of its round, or at most HOLD_S, so that the history has the first failing rank first.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from ftplane import contract
from ftplane.contract import EventType, utcnow_iso
from ftplane.trainer.agent import protocol
from ftplane.trainer.agent.line_progress import LineProgress
from ftplane.trainer.agent.observations import RankProgress


class NodeUplink(Protocol):
    """What of the node's uplink the reports use (both drivers, Uplink and AsyncUplink, offer it)."""

    def event(
        self,
        type: EventType,
        *,
        rank: int | None = None,
        step: int | None = None,
        details: dict[str, Any] | None = None,
        key: str | None = None,
        ts: str | None = None,
        attempt: int | None = None,
    ) -> str: ...

    def forward_event(self, event: dict[str, Any]) -> None: ...

    def heartbeat(self, beat: dict[str, Any]) -> None: ...


HOLD_S = 5.0  # how long a consequence waits for the launcher to report its round's failures


class RunReports:
    def __init__(self, uplink: NodeUplink, node: str, attempt: int, progress: LineProgress | None) -> None:
        self.uplink = uplink
        self.node = node
        self.attempt = attempt
        self.progress = progress
        self._lock = threading.Lock()
        self._announced: set[tuple[int, str]] = set()  # (round, basis) said
        self._seen: dict[int, RankProgress] = {}  # each rank's newest step read from its lines
        self._seen_at: dict[int, str] = {}  # when (ISO) each rank's output showed that step
        self._held: list[tuple[float, dict[str, Any]]] = []  # (deadline, event): consequences held back

    # --- running ---------------------------------------------------------------------------------------

    def ranks_up(self, round_: int, first_seen: str) -> None:
        """The round's rank processes are up (first seen at `first_seen`, ISO time): the run runs."""
        self._running(round_, "processes", None, first_seen)

    def _running(self, round_: int, basis: str, start: int | None, ts: str) -> None:
        with self._lock:
            if (round_, basis) in self._announced:
                return
            self._announced.add((round_, basis))
        key = contract.running_key(self.node, self.attempt, round_)
        self.uplink.event(
            EventType.running,
            ts=ts,
            step=start,
            key=key if basis == "processes" else f"{key}:{basis}",
            details={"restart_count": round_, "iteration": 0, "start_step": start, "source": "agent", "basis": basis},
        )

    # --- progress from the ranks' lines ----------------------------------------------------------------

    def rank_line(self, round_: int, rank: int, text: str) -> None:
        """One line of a rank's output: a heartbeat where it says a step, the run's start where it says that."""
        if self.progress is None:
            return
        with self._lock:
            reading = self.progress.feed(rank, text)
        if reading is None:
            return
        if reading.start_known:
            self._running(round_, "progress", reading.start, utcnow_iso())
        if reading.step is None:
            return
        now = time.monotonic()
        with self._lock:
            held = self._seen.get(rank)
            step_time = None
            if held is not None and reading.step > held.step:
                step_time = (now - held.at) / (reading.step - held.step)
            elif held is not None and reading.step == held.step:
                return  # nothing new (a bar redrawn)
            self._seen[rank] = RankProgress(reading.step, now, step_time or (held.step_time_s if held else None))
            self._seen_at[rank] = seen_at = utcnow_iso()
        beat = protocol.Heartbeat(
            rank=rank, step=reading.step, ts=seen_at, step_time_s=step_time, total_steps=reading.total
        )
        self.uplink.heartbeat(beat.for_control_plane(self.node))

    def step_of(self, rank: int | None) -> tuple[int, str] | None:
        """The rank's highest step read in the current run, and when (ISO) its output showed it."""
        if rank is None:
            return None
        with self._lock:
            held = self._seen.get(rank)
            return (held.step, self._seen_at[rank]) if held is not None else None

    def highest_step(self) -> int | None:
        """The highest step any rank's output showed in the current run."""
        with self._lock:
            return max((held.step for held in self._seen.values()), default=None)

    def new_round(self) -> None:
        """The launcher restarted the ranks: lines from now on are the next run's."""
        with self._lock:
            if self.progress is not None:
                self.progress.new_round()
            self._seen.clear()
            self._seen_at.clear()

    @property
    def reads_progress(self) -> bool:
        return self.progress is not None

    # --- the order of failures -------------------------------------------------------------------------

    def forward(self, event: dict[str, Any]) -> None:
        """A rank's event, forwarded; a failure that is a peer's consequence is held back (see the docstring)."""
        details = event.get("details")
        if event.get("type") == EventType.rank_failed and isinstance(details, dict) and details.get("consequence"):
            with self._lock:
                self._held.append((time.monotonic() + HOLD_S, event))
            return
        self.uplink.forward_event(event)

    def release_all(self) -> None:
        self.release(all_held=True)

    def release(self, *, all_held: bool = False) -> None:
        """Forward the consequences held back: all of them (the launcher reported the round), or those due."""
        now = time.monotonic()
        with self._lock:
            due = [e for at, e in self._held if all_held or at <= now]
            self._held = [(at, e) for at, e in self._held if not (all_held or at <= now)]
        for event in due:
            self.uplink.forward_event(event)
