"""One rank's run: what the training loop reports, and the fault-injection hook it runs.

`init()` reads the environment that the backend, the node agent and the launcher give a rank and
returns the process's `Run`. Reports go to the node agent (trainer/sdk/channel.py), never to the
network; without an agent (`FTPLANE_AGENT_SOCKET`) or a control plane (`FTPLANE_URL`) reporting is
off and every report is a no-op, so the same script runs anywhere. Two things do not depend on
the agent: ft_launcher's rank heartbeats (sent whenever the launcher's rank monitor is there, see
trainer/nvrx.py) and the faults of `FTPLANE_FAULTS` (deterministic injection, for whoever sets it).

On the training thread nothing waits: `step()` stores the newest heartbeat, counts progress for
ft_launcher, pings NVRx's in-process Wrapper when inside one, and runs the fault hook, which
does something only at the step a fault is due (or sleeps, in a slowdown). Events are queued and
sent by a thread.

Stragglers: each heartbeat carries the step's wall time (`step_time_s`) and, when the loop times
its own work with `run.compute()`, that work's seconds (`compute_s`). In synchronous training every
rank's step takes the job's time (the fast ranks wait in the collectives), so a slow rank shows
only in the work it does alone: that is what `compute()` measures, and what the control plane
compares across ranks. The time `step()` itself spends in the fault hook counts as the rank's own
work too (a slowdown's sleep, which is how a straggler is simulated). NVRx's own scores, where it
runs: trainer/sdk/stragglers.py.

One module of ~600 lines on purpose: `Run` is the SDK's whole surface for a training loop, and a
reader should find every call a loop makes, and what each does on its thread, in one place.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import os
import statistics
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from trainer.agent.protocol import SOCKET_ENV
from trainer.faults import FaultInjector, FaultSpec, marker_dir, parse_faults
from trainer.sdk.channel import AgentChannel
from trainer.sdk.sink import checkpoint_saved_details

if TYPE_CHECKING:
    import torch.distributed as dist

    from trainer.nvrx import Iteration, ProgressHeartbeats, RestartCauses

log = logging.getLogger("trainer.sdk")

FT_RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"  # set by ft_launcher for its workers
FAILURE_FLUSH_S = 2.0
EXCLUDE_FLUSH_S = 2.0
EXIT_FLUSH_S = 5.0
MAX_EXCEPTION_CHARS = 4000
MAX_CAUSE_CHARS = 500
RECENT_STEPS = 5  # step times a slowdown's sleep is a fraction of (their median, before it began)


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected an integer") from None


@dataclass(frozen=True)
class Environment:
    """What the backend, the node agent and the launcher tell a rank about itself."""

    agent_socket: str | None = None  # FTPLANE_AGENT_SOCKET, set by the node agent
    url: str | None = None  # FTPLANE_URL: the control plane exists (the agent talks to it, never the ranks)
    job_id: str | None = None
    attempt: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart_count: int = 0  # ft_launcher's worker-group restarts so far
    checkpoint_dir: str | None = None
    faults: list[FaultSpec] = field(default_factory=list)
    rank_monitor: bool = False  # under ft_launcher: its rank monitor listens for heartbeats

    @property
    def reporting(self) -> bool:
        return bool(self.agent_socket and self.url)

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        """From FTPLANE_* and the launcher's variables; a malformed value raises ValueError naming it."""
        env = os.environ if environ is None else environ
        return cls(
            agent_socket=env.get(SOCKET_ENV) or None,
            url=env.get("FTPLANE_URL") or None,
            job_id=env.get("FTPLANE_JOB_ID") or None,
            attempt=_int(env, "FTPLANE_ATTEMPT", 0),
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=_int(env, "WORLD_SIZE", 1),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            checkpoint_dir=env.get("FTPLANE_CHECKPOINT_DIR") or None,
            faults=parse_faults(env.get("FTPLANE_FAULTS")),
            rank_monitor=bool(env.get(FT_RANK_MONITOR_ENV)),
        )


def _utcnow() -> str:
    return datetime.now(UTC).isoformat()


def _is_restart_signal(exc: BaseException) -> bool:
    """NVRx's Wrapper interrupting a healthy rank because another failed: not this rank's failure."""
    if "nvidia_resiliency_ext" not in sys.modules:
        return False  # nothing of NVRx is loaded, so nothing raised by it
    from trainer import nvrx

    return nvrx.is_restart_signal(exc)


class Run:
    """One rank's reports and fault hook. Made by `trainer.sdk.init()`; see trainer/sdk/__init__.py."""

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
        self.env = env
        self.enabled = env.reporting
        self.rank = env.rank
        self.total_steps = total_steps
        self._key_prefix = uuid.uuid4().hex[:16]  # event keys: this prefix and a counter, unique per process
        self._key_seq = 0
        self._key_lock = threading.Lock()
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
        self._finished = False
        self._previous_excepthook: Callable[..., Any] | None = None

        self.faults: FaultInjector | None = self._injector(env.faults) if env.faults else None
        self.channel: AgentChannel | None = None
        if self.enabled:
            assert env.agent_socket is not None
            self.channel = AgentChannel(
                env.agent_socket,
                rank=env.rank,
                interval_s=interval_s,
                max_queued=max_queued,
                on_faults=self._on_faults,
            )

        self.heartbeats: ProgressHeartbeats | None = None
        if nvrx_heartbeats and env.rank_monitor:
            from trainer.nvrx import ProgressHeartbeats

            self.heartbeats = ProgressHeartbeats()

        self.causes: RestartCauses | None = None
        if store is not None:
            self.share_failures(store)

    # --- who and where ------------------------------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        return self.env.job_id

    @property
    def attempt(self) -> int:
        return self.env.attempt

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def restart_count(self) -> int:
        return self.env.restart_count

    @property
    def checkpoint_dir(self) -> str | None:
        return self.env.checkpoint_dir

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

    def step(self, n: int, *, loss: float | None = None, tokens: float | None = None) -> None:
        """`n` steps are done (call it once per step, after any checkpoint of that step). O(1) and no
        I/O: stores the newest heartbeat (step, loss, throughput = `tokens` per step time, step time
        measured from the previous call), counts progress for ft_launcher's rank monitor and NVRx's
        in-process Wrapper, then fires a fault due before step `n` runs, if any (the only thing that
        may not return). Pass `loss` as a float (`loss.item()`), not a device tensor."""
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
        self._fault_hook(n)

    def _running(self, start_step: int, details: Mapping[str, Any] | None) -> str:
        self._started = True
        return self.event(
            "running",
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

    # --- events ---------------------------------------------------------------------------------------

    def event(
        self,
        type: str,
        details: Mapping[str, Any] | None = None,
        *,
        step: int | None = None,
        key: str | None = None,
        rank: int | None = None,
    ) -> str:
        """Queue an event of this rank (sent at once, in order, kept while the agent is away); returns
        its idempotency key, `key` when given (a resend or a second sender of the same fact is then
        stored once). Never waits."""
        if key is None:
            with self._key_lock:
                self._key_seq += 1
                key = f"{self._key_prefix}-{self._key_seq}"
        if self.channel is None or self._finished:
            return key
        self.channel.send(
            {
                "type": "event",
                "event": {
                    "key": key,
                    "type": type,
                    "ts": _utcnow(),
                    "attempt": self.attempt,
                    "rank": self.rank if rank is None else rank,
                    "step": step,
                    "details": dict(details or {}),
                },
            }
        )
        return key

    def checkpoint_saved(
        self,
        step: int,
        *,
        blocking_s: float,
        total_s: float | None = None,
        bytes: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> str:
        """The checkpoint of `step` is complete. Call it when it is (for an async save: when the write
        has finished): the training loop was held `blocking_s` of the save's `total_s` (default: all of
        it, as for a synchronous save), counted back from now."""
        total = blocking_s if total_s is None else total_s
        return self.event(
            "checkpoint_saved",
            checkpoint_saved_details(step, blocking_s=blocking_s, total_s=total, bytes=bytes, **(details or {})),
            step=step,
        )

    def checkpoint_loaded(
        self,
        step: int,
        *,
        load_s: float | None = None,
        path: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> str:
        """Training resumed from the checkpoint of `step`."""
        facts: dict[str, Any] = {"step": step}
        if load_s is not None:
            facts["load_s"] = round(load_s, 4)
        if path is not None:
            facts["path"] = path
        return self.event("checkpoint_loaded", {**facts, **(details or {})}, step=step)

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
        if _is_restart_signal(exc):
            log.warning("rank %d interrupted for an in-process restart: %s", self.rank, exc)
            return None
        text = "".join(traceback.format_exception_only(exc)).strip()
        message = str(exc).strip().splitlines()
        cause = (f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__)[:MAX_CAUSE_CHARS]
        step = self._step if step is None else step
        facts: dict[str, Any] = {
            "cause": cause,
            "cause_class": "exception",
            "rank": self.rank,
            "exception_type": type(exc).__name__,
            "exception": text[:MAX_EXCEPTION_CHARS],
            "iteration": self._iteration,
            "restart_count": self.restart_count,
            "inprocess": self.inprocess,
        }
        if self.causes is not None:
            first, first_cause = self.causes.record(self._iteration, self.rank, cause)
            facts["first_to_fail"], facts["first_failure"] = first, first_cause
        log.error("rank %d failed at step %d: %s", self.rank, step, cause)
        key = self.event("rank_failed", {**facts, **(details or {})}, step=step)
        self.flush(FAILURE_FLUSH_S)
        return key

    def exclude_node(self, reason: str) -> None:
        """Ask for this node to be excluded (bad GPU, ECC errors, ...): the agent reports the node
        unhealthy, stops the launcher and leaves with the status that makes the control plane restart
        the job elsewhere. Waits up to 2 s for the message to reach the agent."""
        log.error("rank %d asks to exclude this node: %s", self.rank, reason)
        if self.channel is None or self._finished:
            return
        self.channel.send({"type": "exclude_node", "rank": self.rank, "reason": str(reason)[:2000]})
        self.flush(EXCLUDE_FLUSH_S)

    def flush(self, timeout: float = EXIT_FLUSH_S) -> bool:
        """Wait up to `timeout` s until everything queued has reached the agent; True if so (always
        when reporting is off)."""
        if self.channel is None:
            return True
        return self.channel.flush(timeout)

    def finish(self, timeout: float = EXIT_FLUSH_S) -> bool:
        """Flush (bounded), then stop: threads end, sockets close, later calls are no-ops. Returns
        whether everything reached the agent. Also run at interpreter exit."""
        global _current
        if self._finished:
            return True
        delivered = True
        if self.channel is not None:
            delivered = self.channel.close(timeout)
        self._finished = True
        if self.heartbeats is not None:
            self.heartbeats.close()
        if self._previous_excepthook is not None and sys.excepthook == self._excepthook:
            sys.excepthook = self._previous_excepthook
        if _current is self:
            _current = None
        return delivered

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
        from trainer.nvrx import RestartCauses

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
                "inprocess_restart",
                {
                    "iteration": iteration.index,
                    "cause": cause or "unknown",
                    "cause_class": "exception" if cause else "unknown",
                    "restart_count": self.restart_count,
                },
                key=f"inprocess_restart:{self.job_id}:{self.attempt}:{self.restart_count}:{iteration.index}",
            )

    def leave_iteration(self) -> None:
        self._wrapper = None

    def report_uncaught_exceptions(self) -> None:
        """Report an exception that ends the script (`sys.excepthook`, the previous hook still runs)."""
        if self._previous_excepthook is None:
            self._previous_excepthook = sys.excepthook
            sys.excepthook = self._excepthook

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if not isinstance(exc, KeyboardInterrupt):
            try:
                self.failed(exc)
            except Exception:  # reporting must never hide the original error
                log.exception("reporting the uncaught exception failed")
        previous = self._previous_excepthook or sys.__excepthook__
        previous(exc_type, exc, tb)

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


_current: Run | None = None
_current_lock = threading.Lock()


def init(
    total_steps: int | None = None,
    *,
    interval_s: float = 0.5,
    nvrx_heartbeats: bool = True,
    store: dist.Store | None = None,
    report_uncaught: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Run:
    """This process's run, made on the first call from the environment (later calls return the same
    run, with `total_steps` updated when given).

    total_steps      the job's length, for progress and ETA on the job's page
    interval_s       seconds between heartbeats sent to the agent (the newest one each time)
    nvrx_heartbeats  under ft_launcher, send its rank monitor the heartbeats its hang detection needs
                     (turn off if the script sends them itself with NVRx's RankMonitorClient)
    store            a torch.distributed Store all ranks share: failures say which rank failed first
    report_uncaught  an exception that ends the script is reported as `rank_failed`
    """
    global _current
    with _current_lock:
        if _current is not None:
            if total_steps is not None:
                _current.total_steps = total_steps
            if store is not None and _current.causes is None:
                _current.share_failures(store)
            return _current
        run = Run(
            Environment.read(environ),
            total_steps=total_steps,
            interval_s=interval_s,
            nvrx_heartbeats=nvrx_heartbeats,
            store=store,
        )
        if report_uncaught:
            run.report_uncaught_exceptions()
        atexit.register(run.finish, FAILURE_FLUSH_S)
        _current = run
    if not run.enabled:
        log.debug("ftplane reporting is off (no %s or FTPLANE_URL): the SDK's reports are no-ops", SOCKET_ENV)
    return run


def current() -> Run | None:
    """The run `init()` made in this process, if any (and not finished)."""
    return _current
