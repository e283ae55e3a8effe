"""One rank's run: what the training loop reports, and the fault-injection hook it runs.

`init()` (trainer/sdk/process_run.py) reads the environment that the backend, the node agent and the launcher
give a rank and returns the process's `Run`. Reports go to the node agent (trainer/sdk/channel.py), never to
the network; without an agent (`FTPLANE_AGENT_SOCKET`) or a control plane (`FTPLANE_URL`) reporting is off and
every report is a no-op, so the same script runs anywhere. Two things do not depend on the agent:
ft_launcher's rank heartbeats (sent whenever the launcher's rank monitor is there, see trainer/nvrx/) and the
faults of `FTPLANE_FAULTS` (deterministic injection, for whoever sets it).

On the training thread nothing waits: `step()` stores the newest heartbeat, counts progress for
ft_launcher, pings NVRx's in-process Wrapper when inside one, and runs the fault hook, which
does something only at the step a fault is due (or sleeps, in a slowdown). Events are queued and
sent by a thread. Work that makes no steps (validation, a save) is marked with `phase()`.

Stopping (an eviction, a drain, a cancel: SIGTERM, once `termination.install()` was called): `should_stop()`
is true on every rank once any was told, so the loop saves that step and ends (trainer/sdk/termination.py).

Stragglers: `compute()` times the rank's own work, which heartbeats carry as `compute_s`; NVRx's own
scores, where it runs: trainer/sdk/stragglers.py.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ftplane.contract import EventType, inprocess_restart_key
from ftplane.trainer.faults import FaultInjector, FaultSpec, marker_dir
from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.failures import UncaughtExceptions, exception_cause, is_restart_signal
from ftplane.trainer.sdk.phases import Phases
from ftplane.trainer.sdk.reporter import EXIT_FLUSH_S, Reporter

if TYPE_CHECKING:
    import torch.distributed as dist

    from ftplane.trainer.nvrx.heartbeats import ProgressHeartbeats
    from ftplane.trainer.nvrx.inprocess_restart import Iteration, RestartCauses

log = logging.getLogger("ftplane.trainer.sdk")

FAILURE_FLUSH_S = 2.0
RECENT_STEPS = 5  # step times a slowdown's sleep is a fraction of (their median, before it began)


class Run(Reporter):
    """One rank's reports and fault hook. Made by `ftplane.trainer.sdk.init()`; see trainer/sdk/__init__.py."""

    def __init__(
        self,
        env: Environment,
        *,
        total_steps: int | None = None,
        interval_s: float = 0.5,
        nvrx_heartbeats: bool = True,
        store: dist.Store | None = None,
        max_queued: int = 10_000,
    ) -> None:
        super().__init__(env, interval_s=interval_s, max_queued=max_queued, on_faults=self._on_faults)
        self.total_steps = total_steps
        self._iteration = 0
        self._wrapper: Iteration | None = None  # set while inside NVRx's in-process Wrapper
        self._started = False  # a `running` event was sent for this iteration
        self._last_step_at: float | None = None
        self._step = 0
        self._recent_steps: collections.deque[float] = collections.deque(maxlen=RECENT_STEPS)
        self._compute_s = 0.0  # the rank's own work in the step under way (compute() sections, the fault hook)
        self._timed = False  # the loop times its own work: heartbeats carry compute_s
        self.perf_score: float | None = None  # set by the NVRx straggler helper (trainer/sdk/stragglers.py)
        self._step_hooks: list[Callable[[], None]] = []
        self._reported: BaseException | None = None
        self._uncaught = UncaughtExceptions(self.failed)

        self.faults: FaultInjector | None = self._injector(env.faults) if env.faults else None

        self.heartbeats: ProgressHeartbeats | None = None
        if nvrx_heartbeats and env.rank_monitor:
            from ftplane.trainer.nvrx.heartbeats import ProgressHeartbeats

            self.heartbeats = ProgressHeartbeats()
        self.phases = Phases(self._keep_alive, interval_s=interval_s)

        self.causes: RestartCauses | None = None
        if store is not None:
            self.share_failures(store)

    @property
    def iteration(self) -> int:
        """The in-process restart iteration (0 outside NVRx's Wrapper, and in its first iteration)."""
        return self._iteration

    @property
    def inprocess(self) -> bool:
        """Whether the training function runs inside NVRx's in-process Wrapper."""
        return self._wrapper is not None

    # --- the loop -------------------------------------------------------------------------------------

    def start(self, step: int = 0, details: Mapping[str, Any] | None = None) -> str:
        """The loop starts (or resumes, after a restart) at `step`, the steps already done: reports
        `running` (what goodput starts a run from), then runs the fault hook for `step`. Optional: the
        first `step()` of an iteration reports `running` if this was not called."""
        key = self._running(step, details)
        self._last_step_at = time.perf_counter()
        self._step = step
        self._compute_s = 0.0
        self._fault_hook(step)
        return key

    @contextlib.contextmanager
    def compute(self) -> Iterator[None]:
        """Time a section of this rank's own work in the current step: no collective, barrier or other wait
        on the other ranks inside (e.g. the data loading, the optimizer step of a sharded optimizer, a forward
        pass without collectives). Sections add up per step; each heartbeat then carries their sum as
        `compute_s`, the figure straggler detection compares across ranks."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self._compute_s += time.perf_counter() - started
            self._timed = True

    def add_step_hook(self, hook: Callable[[], None]) -> None:
        """Call `hook` in every `step()`, before the heartbeat is stored (the NVRx straggler helper's report)."""
        self._step_hooks.append(hook)

    def remove_step_hook(self, hook: Callable[[], None]) -> None:
        if hook in self._step_hooks:
            self._step_hooks.remove(hook)

    def _fault_hook(self, step: int) -> None:
        """A fault due before `step` runs fires (may not return); a slowdown sleeps. The time spent here is this
        rank's own, counted in the next step's compute_s."""
        if self.faults is None:
            return
        started = time.perf_counter()
        recent = statistics.median(self._recent_steps) if self._recent_steps else None
        try:
            self.faults.before_step(step, recent)
        finally:
            self._compute_s += time.perf_counter() - started

    def step(self, n: int, *, loss: float | None = None, tokens: float | None = None, inject: bool = True) -> None:
        """`n` steps are done (call it once per step, after any checkpoint of that step). O(1) and no
        I/O: stores the newest heartbeat (step, loss, throughput = `tokens` per step time, step time
        measured from the previous call), counts progress for ft_launcher's rank monitor and NVRx's
        in-process Wrapper, then fires a fault due before step `n` runs, if any (the only thing that
        may not return). Pass `loss` as a float (`loss.item()`), not a device tensor. A framework's callback,
        whose checkpoint of step `n` is written later, passes `inject=False`, then calls `before_step(n)`."""
        if self._finished:
            return
        now = time.perf_counter()
        if not self._started:
            self._running(max(n - 1, 0), None)  # assumes one step was done since the loop (re)started
        step_time = now - self._last_step_at if self._last_step_at is not None else None
        self._last_step_at = now
        self._step = n
        if step_time is not None:
            self._recent_steps.append(step_time)
        compute = self._compute_s if self._timed else None
        self._compute_s = 0.0
        for hook in self._step_hooks:
            hook()
        if self.channel is not None:
            self.channel.heartbeat(
                {
                    "step": n,
                    "ts": time.time(),
                    "loss": loss,
                    "step_time_s": step_time,
                    "compute_s": compute,
                    "perf_score": self.perf_score,
                    "throughput": tokens / step_time if tokens is not None and step_time else None,
                    "total_steps": self.total_steps,
                }
            )
        if self.heartbeats is not None:
            self.heartbeats.progress()
        if self._wrapper is not None:
            self._wrapper.ping()
        if inject:
            self._fault_hook(n)

    def should_stop(self, group: dist.ProcessGroup | None = None) -> bool:
        """`if run.should_stop():` save this step, then end (`termination.end()`): true on every rank once any
        rank of `group` (default: the job) has been told to stop, by SIGTERM after `termination.install()`.
        A collective: every rank calls it at the same step (each step, or every few); alone, this rank's flag."""
        return termination.agreed(group)

    def before_step(self, n: int) -> None:
        """The loop is about to run step `n` (0-based: `n` steps are done, and their checkpoint is written):
        fires a fault due then, if any (may not return). For loops that pass `step(..., inject=False)`."""
        if not self._finished:
            self._fault_hook(n)

    def phase(self, name: str, *, timeout_s: float | None = None) -> contextlib.AbstractContextManager[None]:
        """`with run.phase("validation"):` work that makes no steps is no hang: heartbeats go on, for at most
        `timeout_s` (trainer/sdk/phases.py; `run.phases.begin(name)`/`.end()` where a `with` does not fit)."""
        return self.phases.open(name, timeout_s)

    def _keep_alive(self) -> None:
        """A heartbeat of each kind, at the step the rank is at (the phases' thread calls it)."""
        if self.channel is not None:
            self.channel.refresh()
        if self.heartbeats is not None:
            self.heartbeats.progress()

    def _running(self, start_step: int, details: Mapping[str, Any] | None) -> str:
        self._started = True
        return self.event(
            EventType.running,
            {
                "restart_count": self.restart_count,
                "iteration": self._iteration,
                "start_step": start_step,
                "world_size": self.world_size,
                "local_rank": self.local_rank,
                "pid": os.getpid(),
                "total_steps": self.total_steps,
                "inprocess": self.inprocess,
                "nvrx_heartbeats": self.heartbeats is not None,
                **(details or {}),
            },
            step=start_step,
        )

    def failed(
        self, exc: BaseException, *, step: int | None = None, details: Mapping[str, Any] | None = None
    ) -> str | None:
        """Report `rank_failed` for an exception that ends this rank's training (cause_class
        `exception`), then flush (bounded: 2 s). With a store shared by all ranks (`share_failures`,
        or the in-process helper's), `first_to_fail` says whether this rank failed first in this
        iteration and `first_failure` names the first. NVRx's signal to a healthy rank that another
        failed, and an exception already reported, report nothing (None)."""
        if exc is self._reported or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            return None
        self._reported = exc
        if is_restart_signal(exc):
            log.warning("rank %d interrupted for an in-process restart: %s", self.rank, exc)
            return None
        facts = exception_cause(exc)
        cause = facts["cause"]
        step = self._step if step is None else step
        facts.update(
            {
                "rank": self.rank,
                "iteration": self._iteration,
                "restart_count": self.restart_count,
                "inprocess": self.inprocess,
            }
        )
        if self.causes is not None:
            first, first_cause = self.causes.record(self._iteration, self.rank, cause)
            facts["first_to_fail"], facts["first_failure"] = first, first_cause
        log.error("rank %d failed at step %d: %s", self.rank, step, cause)
        key = self.event(EventType.rank_failed, {**facts, **(details or {})}, step=step)
        self.flush(FAILURE_FLUSH_S)
        return key

    def finish(self, timeout: float = EXIT_FLUSH_S) -> bool:
        """Flush (bounded), then stop: threads end, sockets close, later calls are no-ops. Returns
        whether everything reached the agent. Also run at interpreter exit."""
        if self._finished:
            return True
        delivered = True
        if self.channel is not None:
            delivered = self.channel.close(timeout)
        self._finished = True
        if self.heartbeats is not None:
            self.heartbeats.close()
        self.phases.close()
        self._uncaught.uninstall()
        return delivered

    @property
    def finished(self) -> bool:
        return self._finished

    def __enter__(self) -> Run:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, KeyboardInterrupt | SystemExit):
            self.failed(exc)
        self.finish()

    # --- what the helpers (and advanced loops) use ----------------------------------------------------

    def share_failures(self, store: dist.Store) -> None:
        """Record failures in `store`, shared by all ranks, first writer wins: `rank_failed` then says
        which rank failed first and `inprocess_restart` names that root cause, not the timeouts it set
        off on the other ranks."""
        from ftplane.trainer.nvrx.inprocess_restart import RestartCauses

        self.causes = RestartCauses(store, self.restart_count)

    def enter_iteration(self, iteration: Iteration, store: dist.Store | None = None) -> None:
        """The training function is (re-)entered inside NVRx's Wrapper (trainer/sdk/restart.py calls
        this): the next `running` event belongs to this iteration, `step()` pings the Wrapper, ft_launcher's
        heartbeats reconnect, and from the second iteration on rank 0 reports `inprocess_restart` with
        the first failure of the previous one. `store`: where to share failures when none is yet."""
        self._iteration = iteration.index
        self._wrapper = iteration if iteration.call_wrapper is not None else None
        self._started = False
        self._last_step_at = None
        self._reported = None
        self.rank = int(os.environ.get("RANK", self.rank))  # the Wrapper may assign ranks anew
        if store is not None and self.causes is None:
            self.share_failures(store)
        if iteration.index == 0:
            return
        if self.heartbeats is not None:
            self.heartbeats.reconnect()
        if self.rank == 0:
            cause = self.causes.first(iteration.index - 1) if self.causes is not None else None
            self.event(
                EventType.inprocess_restart,
                {
                    "iteration": iteration.index,
                    "cause": cause or "unknown",
                    "cause_class": "exception" if cause else "unknown",
                    "restart_count": self.restart_count,
                },
                key=inprocess_restart_key(self.job_id, self.attempt, self.restart_count, iteration.index),
            )

    def leave_iteration(self) -> None:
        self._wrapper = None

    def report_uncaught_exceptions(self) -> None:
        """Report an exception that ends the script (`sys.excepthook`, the previous hook still runs)."""
        self._uncaught.install()

    def _injector(self, faults: list[FaultSpec]) -> FaultInjector:
        return FaultInjector(
            faults,
            rank=self.env.rank,
            job_id=self.env.job_id,
            markers=marker_dir(self.env.checkpoint_dir, self.env.job_id),
            reporter=self,
        )

    def _on_faults(self, directives: list[dict[str, Any]]) -> None:
        """Directives the agent forwarded (on the channel's receiving thread)."""
        faults = self.faults
        if faults is None:
            faults = self.faults = self._injector([])
        faults.add_directives(directives)
