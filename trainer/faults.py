"""Deterministic fault injection: which fault, on which rank, before which step, once per job.

Faults come from the job spec (`FTPLANE_FAULTS`, fired when `rank` is about to
run step `at_step`) and from the control plane (directives the node agent
forwards to the rank; `at_step: null` means the next step, and a step already
passed also means the next step). Each fault fires once per job, although a job that
resumes from an earlier checkpoint passes the same step again: before firing,
the injecting rank creates a marker file (O_EXCL) on shared storage, and a
fault whose marker exists never fires again.

The kinds and the recovery rung each one exercises (see docs/fault-injection.md):

- `exception`: raised inside the training step. With in-process restart on,
  the NVRx Wrapper catches it and re-enters training in the same processes;
  otherwise the process dies and ft_launcher restarts the workers.
- `crash`: SIGKILL of the rank's own process: ft_launcher restarts the workers.
- `hang`: the step blocks forever, so no heartbeat of either kind follows:
  detected by ft_launcher's rank heartbeat timeout (or the Wrapper's soft
  timeout when in-process restart is on).
- `slowdown`: the rank sleeps `fraction` of its step time (measured before the
  slowdown began) in each of `duration_steps` steps, a straggler: found by the
  control plane's straggler detection, nothing fails. The sleep is the rank's
  own time (no waiting on its peers): the SDK counts it in the step's
  `compute_s`, as it would a slow section of its own work.

`fault_injected` is reported, and flushed (bounded), before the fault fires,
so the event survives even a SIGKILL. Reports go through an `EventSink`
(trainer/sdk/sink.py; the SDK's run is one). Standard library only: the SDK
runs this inside the user's training processes.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from ftplane.contract import EventType

if TYPE_CHECKING:
    from ftplane.trainer.sdk.sink import EventSink

log = logging.getLogger(__name__)

FaultKind = Literal["exception", "crash", "hang", "slowdown"]
MAX_SLOWDOWN_FRACTION = 10.0
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)


class FaultSpecError(ValueError):
    """`FTPLANE_FAULTS` is not what the control plane writes; the message names the entry and the field."""


@dataclass(frozen=True)
class FaultSpec:
    """Inject `kind` on `rank` when it is about to run step `at_step` (0-based; once per job)."""

    kind: str
    rank: int
    at_step: int
    fraction: float | None = None  # slowdown: of the step time, slept each step
    duration_steps: int | None = None  # slowdown: for this many steps


def slowdown_error(fraction: Any, duration_steps: Any) -> str | None:
    """Why a slowdown's fraction or duration is not one the control plane sends, or None."""
    if not isinstance(fraction, int | float) or isinstance(fraction, bool) or not 0 < fraction <= MAX_SLOWDOWN_FRACTION:
        return f"fraction: expected a number in (0, {MAX_SLOWDOWN_FRACTION:g}], got {fraction!r}"
    if not isinstance(duration_steps, int) or isinstance(duration_steps, bool) or duration_steps < 1:
        return f"duration_steps: expected an integer >= 1, got {duration_steps!r}"
    return None


def parse_faults(text: str | Sequence[Mapping[str, Any]] | None) -> list[FaultSpec]:
    """`FTPLANE_FAULTS`: a JSON list of {kind, rank, at_step}; unknown keys are refused."""
    if text is None or text == "":
        return []
    try:
        items = json.loads(text) if isinstance(text, str) else list(text)
    except json.JSONDecodeError as exc:
        raise FaultSpecError(f"faults (FTPLANE_FAULTS): not valid JSON ({exc}); expected a list") from exc
    if not isinstance(items, list):
        raise FaultSpecError("faults (FTPLANE_FAULTS): expected a JSON list of {kind, rank, at_step}")
    faults = []
    for i, item in enumerate(items):
        where = f"faults[{i}]"
        if not isinstance(item, Mapping):
            raise FaultSpecError(f"{where}: expected an object with kind, rank, at_step")
        unknown = set(item) - {"kind", "rank", "at_step", "fraction", "duration_steps"}
        if unknown:
            raise FaultSpecError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
        kind = item.get("kind")
        if kind not in FAULT_KINDS:
            raise FaultSpecError(f"{where}.kind: {kind!r} is not one of {', '.join(FAULT_KINDS)}")
        numbers = {}
        for name in ("rank", "at_step"):
            value = item.get(name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise FaultSpecError(f"{where}.{name}: expected an integer >= 0, got {value!r}")
            numbers[name] = value
        fraction, duration = item.get("fraction"), item.get("duration_steps")
        if kind == "slowdown" and (why := slowdown_error(fraction, duration)) is not None:
            raise FaultSpecError(f"{where}.{why}")
        if kind != "slowdown" and (fraction is not None or duration is not None):
            raise FaultSpecError(f"{where}: fraction and duration_steps are for kind slowdown only")
        faults.append(FaultSpec(kind=kind, fraction=fraction, duration_steps=duration, **numbers))
    return faults


class InjectedFault(RuntimeError):
    """The exception raised by an `exception` fault."""


@dataclass(frozen=True)
class PlannedFault:
    fault_id: str  # unique per job: spec-<index> or the control plane's id
    kind: str
    rank: int
    at_step: int | None
    source: str  # spec | control_plane
    index: int | None = None
    fraction: float | None = None
    duration_steps: int | None = None


@dataclass
class _Slowdown:
    """A slowdown under way: steps [first, end) sleep `fraction` of `base_s` each."""

    fault_id: str
    fraction: float
    first: int
    end: int
    base_s: float | None = None  # the rank's step time before it began (known from the first step measured)


def marker_dir(checkpoint_dir: str | None, job_id: str | None) -> Path:
    """Where fired faults are recorded: shared storage when there is a checkpoint dir."""
    if checkpoint_dir:
        return Path(checkpoint_dir) / ".ftplane" / "faults"
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / f"ftplane-{job_id or 'standalone'}" / "faults"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:120]


class FaultInjector:
    def __init__(
        self,
        faults: list[FaultSpec],
        *,
        rank: int,
        job_id: str | None,
        markers: Path,
        reporter: EventSink,
        flush_timeout_s: float = 2.0,
    ) -> None:
        self.rank = rank
        self.job_id = job_id or "standalone"
        self.markers = markers
        self.reporter = reporter
        self.flush_timeout_s = flush_timeout_s
        self._planned = [
            PlannedFault(f"spec-{i}", f.kind, f.rank, f.at_step, "spec", i, f.fraction, f.duration_steps)
            for i, f in enumerate(faults)
            if f.rank == rank
        ]
        self._slowdowns: list[_Slowdown] = []
        self._directives: list[PlannedFault] = []
        self._seen_directives: set[str] = set()
        self._settled: set[str] = set()  # spec faults considered at their step by this process
        self._lock = threading.Lock()

    def add_directives(self, directives: list[dict[str, Any]]) -> None:
        """Faults asked for by the control plane (called from the thread that receives the agent's messages)."""
        with self._lock:
            for d in directives:
                fault_id, kind, rank = d.get("id"), d.get("kind"), d.get("rank")
                if not isinstance(fault_id, str) or fault_id in self._seen_directives:
                    continue
                self._seen_directives.add(fault_id)
                if rank != self.rank:
                    continue
                if kind not in FAULT_KINDS:
                    log.warning("ignoring fault directive %s: kind %r is not one of %s", fault_id, kind, FAULT_KINDS)
                    continue
                at_step = d.get("at_step")
                fraction, duration = d.get("fraction"), d.get("duration_steps")
                if kind == "slowdown" and (why := slowdown_error(fraction, duration)) is not None:
                    log.warning("ignoring slowdown directive %s: %s", fault_id, why)
                    continue
                self._directives.append(
                    PlannedFault(
                        fault_id,
                        kind,
                        rank,
                        at_step if isinstance(at_step, int) else None,
                        "control_plane",
                        fraction=fraction if kind == "slowdown" else None,
                        duration_steps=duration if kind == "slowdown" else None,
                    )
                )
                log.info("fault directive %s: %s on rank %d at step %s", fault_id, kind, rank, at_step)

    def before_step(self, step: int, step_time_s: float | None = None) -> None:
        """Called by the rank just before it runs step `step` (0-based); may not return. `step_time_s`: the
        rank's recent seconds per step (what a slowdown starting here sleeps a fraction of).

        Faults due at the same step fire one at a time: the first one ends the step (and the
        process or the iteration), the next fires when the step is run again. A slowdown under way
        sleeps here, once per step.
        """
        while (fault := self._next_due(step)) is not None:
            if self._claim(fault, step):
                self._fire(fault, step)
        if self._slowdowns:
            self._slow_down(step, step_time_s)

    def _slow_down(self, step: int, step_time_s: float | None) -> None:
        sleep = 0.0
        for slow in list(self._slowdowns):
            if step >= slow.end:
                self._slowdowns.remove(slow)
                log.warning("slowdown %s on rank %d ended before step %d", slow.fault_id, self.rank, step)
                continue
            if slow.base_s is None:
                slow.base_s = step_time_s
            if slow.base_s is not None and step >= slow.first:
                sleep = max(sleep, slow.fraction * slow.base_s)  # overlapping slowdowns: the slowest wins
        if sleep > 0:
            time.sleep(sleep)

    def _next_due(self, step: int) -> PlannedFault | None:
        with self._lock:
            for fault in self._planned:
                if fault.at_step == step and fault.fault_id not in self._settled:
                    self._settled.add(fault.fault_id)
                    return fault
            for fault in self._directives:
                if fault.at_step is None or fault.at_step <= step:
                    self._directives.remove(fault)
                    return fault
        return None

    def _marker(self, fault: PlannedFault) -> Path:
        return self.markers / f"{_safe(self.job_id)}.{_safe(fault.fault_id)}"

    def _claim(self, fault: PlannedFault, step: int) -> bool:
        """Record the fault as fired; False if it already fired in this job (or cannot be recorded)."""
        path = self._marker(fault)
        record = {
            "kind": fault.kind,
            "rank": self.rank,
            "step": step,
            "ts": datetime.now(UTC).isoformat(),
            "pid": os.getpid(),
        }
        try:
            self.markers.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            log.info("fault %s already fired in this job; not firing it again", fault.fault_id)
            return False
        except OSError as exc:
            log.error("cannot record fault %s under %s (%s); not firing it", fault.fault_id, self.markers, exc)
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        return True

    def _fire(self, fault: PlannedFault, step: int) -> None:
        details: dict[str, Any] = {
            "kind": fault.kind,
            "source": fault.source,
            "fault_id": fault.fault_id,
            "at_step": fault.at_step,
            "pid": os.getpid(),
        }
        if fault.index is not None:
            details["index"] = fault.index
        if fault.kind == "slowdown":
            details.update(fraction=fault.fraction, duration_steps=fault.duration_steps)
        self.reporter.event(EventType.fault_injected, details=details, step=step, rank=self.rank)
        delivered = self.reporter.flush(self.flush_timeout_s)
        log.warning(
            "injecting fault %s: %s on rank %d before step %d (event delivered: %s)",
            fault.fault_id,
            fault.kind,
            self.rank,
            step,
            delivered,
        )
        if fault.kind == "exception":
            raise InjectedFault(f"injected fault {fault.fault_id}: exception on rank {self.rank} at step {step}")
        if fault.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "hang":
            hang_forever()
        if fault.kind == "slowdown":
            assert fault.fraction is not None and fault.duration_steps is not None
            self._slowdowns.append(_Slowdown(fault.fault_id, fault.fraction, step, step + fault.duration_steps))


def hang_forever() -> None:
    """Block the training loop for good. Sleeping in short slices keeps the thread interruptible by
    NVRx's asynchronous restart (the Wrapper) and by signals, as a real hang in Python code would be."""
    while True:
        time.sleep(0.5)
