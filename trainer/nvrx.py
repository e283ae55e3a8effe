"""Every place the trainer hooks into NVIDIA's resiliency extension (NVRx), and nothing else (~500 lines on
purpose: one module, in numbered sections, so each NVRx mechanism and its version notes are found in one place).

1. `HeartbeatClient`, `ProgressHeartbeats` -- ft_launcher's in-job restart and
   hang detection: each rank sends heartbeats over IPC to its rank monitor; a
   rank silent for `--ft-rank-heartbeat-timeout` is killed and the worker group
   restarted. Only active under ft_launcher (it sets FT_RANK_MONITOR_IPC_SOCKET).
   A heartbeat is a round trip to the monitor process, so the SDK sends them
   from a thread of its own, one per interval in which the loop made progress
   (`ProgressHeartbeats`): a hung loop still goes silent, and a slow monitor
   never holds up a step.
2. `wrap_inprocess` -- in-process restart: the training function runs inside
   `inprocess.Wrapper`; on a fault on any rank it is re-entered in the same
   processes (a new process group per iteration, state reloaded from the latest
   checkpoint). `Iteration.ping()` feeds the Wrapper's progress watchdog. The
   SDK's `inprocess` helper (trainer/sdk/restart.py) is what calls it.
3. `NvrxAsyncSaver` -- the async checkpoint engine on CUDA: NVRx's
   `FileSystemWriterAsync` + `AsyncCallsQueue` write a torch.distributed.checkpoint
   from a separate process while training goes on.

Version notes (the trainer runs on nvidia-resiliency-ext 0.4.1 and 0.7.x):
- On CUDA the trainer expects NVRx 0.7.x (`NVRX_FOR_CUDA`, pyproject's `gpu` extra): the async
  writer's warm-up and cached plan below were written against it, and tests/trainer/test_nvrx_cuda.py
  runs on it (bench/gpu_setup.sh, one GPU). `NvrxAsyncSaver` warns on any other version. 0.4.1 is what
  CPU machines install (the Makefile's pin), where the async engine is `dcp.async_save`.
- The few private NVRx attributes used here (0.4.1's `_get_write_results_queue`, its
  `AsyncCallsQueue.async_calls` and `persistent_caller`) are touched only on the versions whose source
  they were read in (`NVRX_INTERNALS_READ`, checked by `internals_read()`); elsewhere the code takes a
  public call or does without (tests/trainer/test_nvrx_versions.py).
- NVRx marks in-process restart deprecated from 0.6 on. ftplane keeps the rung
  (it is the cheapest where it works); `inprocess_available()` says whether the
  installed NVRx still has the Wrapper, and the SDK runs the training function
  unwrapped (the next rung, ft_launcher's in-job restart, then handles faults)
  where it does not. The policy classes below then stand on plain bases, unused.
- From 0.5-ish the Wrapper appends GPU and NVLink health checks (NVML) to the
  restart health check whenever LOCAL_RANK is set, which ft_launcher always
  sets. They fail on a machine without NVML, so on CPU the trainer replaces
  `restart_health_check` with its own checks (guarded by `hasattr`).
- The Wrapper's store is given an explicit host and port (MASTER_PORT + 1),
  never MASTER_ADDR, which ft_launcher sets to a local name.
- The async writer needs CUDA (it synchronizes the device and all-reduces CUDA
  tensors while finalizing); on CPU the async engine is `dcp.async_save`.
- The writer's results travel through one multiprocessing Manager queue per
  process (`get_write_results_queue`, `_get_write_results_queue` before), made on
  the first save; starting the manager process takes seconds, so it is started
  on a thread as soon as the saver exists.
- `FileSystemWriterAsync(use_cached_data_structure=...)` (0.6-ish on) keeps the
  GPU tensors' IPC handles in the writer process between saves; it is passed only
  where the writer takes it. Receiving them is most of a save's blocking time the
  first time, so `NvrxAsyncSaver.warm_up` has the writer receive them in the
  background (it runs a planned save's preload step alone).

This module deliberately does not use `from __future__ import annotations`:
the Wrapper finds the parameter that receives its `CallWrapper` by evaluating
annotations.
"""

import datetime
import importlib.metadata
import inspect
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

try:
    from nvidia_resiliency_ext import inprocess as _inprocess

    inprocess: Any = _inprocess
except ImportError:  # pragma: no cover - an NVRx without in-process restart
    inprocess = None

log = logging.getLogger(__name__)

try:
    NVRX_VERSION: str | None = importlib.metadata.version("nvidia-resiliency-ext")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - e.g. a source checkout on PYTHONPATH
    NVRX_VERSION = None
FT_RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
# The NVRx the CUDA path (the async checkpoint writer) is written against and tested with; pyproject's
# `gpu` extra pins the same.
NVRX_FOR_CUDA = "~=0.7.0"
# Versions whose source the private attributes used below were read in.
NVRX_INTERNALS_READ = ("==0.4.1", "~=0.7.0")


def nvrx_version_matches(specifier: str, version: str | None = None) -> bool:
    """Whether the installed NVRx (or `version`) satisfies `specifier`; False when it is unknown."""
    version = NVRX_VERSION if version is None else version
    if version is None:
        return False
    try:
        return Version(version) in SpecifierSet(specifier)
    except InvalidVersion:
        return False


def internals_read(version: str | None = None) -> bool:
    """Whether NVRx's private attributes may be used: only on the versions they were read in."""
    return any(nvrx_version_matches(spec, version) for spec in NVRX_INTERNALS_READ)


# --- 1. ft_launcher heartbeats -------------------------------------------------------------------


class HeartbeatClient:
    """One heartbeat per step to this rank's ft_launcher rank monitor (a no-op outside ft_launcher)."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get(FT_RANK_MONITOR_ENV))
        self._client: RankMonitorClient | None = None
        self._broken = False

    def connect(self) -> None:
        """(Re)connect at the start of every training iteration, as NVRx's examples do."""
        if not self.enabled:
            return
        self.close()
        try:
            self._client = RankMonitorClient()
            self._client.init_workload_monitoring()
            self._broken = False
        except Exception as exc:
            # Training goes on; hang detection by ft_launcher does not (the launcher logs it too).
            log.error("cannot connect to the ft_launcher rank monitor (%s); no NVRx heartbeats", exc)
            self._client = None

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_initialized

    def beat(self) -> None:
        if self._client is None or self._broken:
            return
        try:
            self._client.send_heartbeat()
        except Exception as exc:
            self._broken = True
            log.error("NVRx heartbeat failed (%s); no more heartbeats this iteration", exc)

    def close(self) -> None:
        if self._client is not None and self._client.is_initialized:
            try:
                self._client.shutdown_workload_monitoring()
            except Exception as exc:
                log.debug("rank monitor shutdown: %s", exc)
        self._client = None


class ProgressHeartbeats:
    """ft_launcher's rank heartbeats for a loop that must never wait on them.

    The loop calls `progress()` once per step (an integer increment, nothing else). A daemon thread
    owns the `HeartbeatClient`: it connects (again at each `reconnect()`, i.e. at each entry of the
    training function, as NVRx's examples do), then sends one heartbeat per `interval_s` in which
    the loop progressed. A hung loop progresses no more, so the rank monitor hears nothing and
    ft_launcher restarts the group after --ft-rank-heartbeat-timeout, as with a heartbeat sent by
    the loop itself, at most `interval_s` later. Until the first step after a (re)connect the
    launcher's initial timeout applies (model build, checkpoint load).
    """

    def __init__(self, interval_s: float = 0.25, client: HeartbeatClient | None = None) -> None:
        self.client = client if client is not None else HeartbeatClient()
        self.enabled = self.client.enabled
        self.interval_s = interval_s
        self._progress = 0
        self._connects = 1 if self.enabled else 0  # connect requests; the thread connects on each new one
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="ftplane-nvrx-heartbeats", daemon=True)
            self._thread.start()

    @property
    def connected(self) -> bool:
        return self.client.connected

    def progress(self) -> None:
        """The loop made progress (called on the training thread: O(1), no I/O)."""
        self._progress += 1

    def reconnect(self) -> None:
        """Connect again (a new training iteration): the launcher's initial timeout applies anew."""
        if self.enabled:
            self._connects += 1
            self._wake.set()

    def close(self, timeout: float = 2.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # stuck on the monitor: a daemon thread, it ends with the process
        self.client.close()

    def _run(self) -> None:
        connected_for, sent = 0, 0
        while not self._stopping:
            if self._connects != connected_for:
                connected_for = self._connects
                self.client.connect()
                sent = self._progress  # the initial timeout runs until the next step
            elif self._progress != sent:
                sent = self._progress
                self.client.beat()
            self._wake.wait(self.interval_s)
            self._wake.clear()


# --- 2. in-process restart ------------------------------------------------------------------------


@dataclass
class Iteration:
    """What the training function knows of the in-process restart loop."""

    index: int = 0
    call_wrapper: Any = None

    def ping(self) -> None:
        """Progress for the Wrapper's soft/hard timeouts (one per step)."""
        if self.call_wrapper is not None:
            self.call_wrapper.ping()


def inprocess_available() -> bool:
    """Whether the installed NVRx still has in-process restart (deprecated from 0.6 on)."""
    return inprocess is not None and hasattr(inprocess, "Wrapper")


_HealthCheck: Any = inprocess.health_check.HealthCheck if inprocess is not None else object
_Finalize: Any = inprocess.finalize.Finalize if inprocess is not None else object
_RankAssignment: Any = inprocess.rank_assignment.RankAssignment if inprocess is not None else object


class RestartBudget(_HealthCheck):
    """Refuse a restart after `max_iterations` in-process restarts: every rank then leaves the
    Wrapper and the process exits, so the next rung (ft_launcher's in-job restart) takes over.

    NVRx runs health checks before every iteration and again before a restart; only the latter
    counts. `BeforeRestart` (the Wrapper's `finalize`, which runs only on the restart path) tells
    them apart. Every rank counts the same iterations, so all refuse together."""

    def __init__(self, max_iterations: int) -> None:
        self.max_iterations = max_iterations
        self.restarting = False

    def __call__(self, state):  # noqa: ANN001, ANN204 - NVRx's FrozenState
        restarting, self.restarting = self.restarting, False
        if restarting and state.iteration + 1 > self.max_iterations:
            raise RuntimeError(
                f"in-process restart budget spent ({self.max_iterations} restart(s)); leaving recovery to ft_launcher"
            )
        return state


class BeforeRestart(_Finalize):
    def __init__(self, budget: RestartBudget) -> None:
        self.budget = budget

    def __call__(self, state):  # noqa: ANN001, ANN204
        self.budget.restarting = True
        return state


class AllRanksOrNone(_RankAssignment):
    """Restart in process only with the whole world. NVRx's default would shrink the world around a
    rank that left (terminated, or gone on to the next rung); FSDP's sharding and the per-rank data
    would then silently change. Instead every rank leaves the Wrapper, and ft_launcher restarts the
    worker group at full size."""

    def __init__(self) -> None:
        self.assign = inprocess.Compose(
            inprocess.rank_assignment.ActivateAllRanks(), inprocess.rank_assignment.ShiftRanks()
        )

    def __call__(self, ctx):  # noqa: ANN001, ANN204 - NVRx's RankAssignmentCtx
        if ctx.terminated_ranks:
            raise inprocess.rank_assignment.RankDiscarded(
                f"rank(s) {sorted(ctx.terminated_ranks)} left the in-process restart; leaving too"
            )
        return self.assign(ctx)


def _restart_signal_types() -> tuple[type[BaseException], ...]:
    try:
        from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart
    except ImportError:  # pragma: no cover - moved in some release
        return ()
    return (RankShouldRestart,)


RESTART_SIGNALS = _restart_signal_types()


def is_restart_signal(exc: BaseException) -> bool:
    """True for the Wrapper interrupting a healthy rank because another one failed."""
    return isinstance(exc, RESTART_SIGNALS)


def wrap_inprocess(
    train: Callable[[Iteration], None],
    *,
    store_host: str,
    store_port: int,
    soft_timeout_s: float,
    hard_timeout_s: float,
    max_iterations: int,
    cuda: bool,
) -> Callable[[], None]:
    """`train` wrapped in NVRx's in-process restart, configured from the job spec. The Wrapper's
    store is its own, at `store_host:store_port` (rank 0 hosts it)."""
    soft = datetime.timedelta(seconds=soft_timeout_s)
    hard = datetime.timedelta(seconds=hard_timeout_s)
    barrier = max(datetime.timedelta(seconds=120), hard + datetime.timedelta(seconds=30))
    budget = RestartBudget(max_iterations)
    health = budget
    if cuda:
        health = inprocess.Compose(inprocess.health_check.CudaHealthCheck(), budget)

    wrapper = inprocess.Wrapper(
        store_kwargs={"host_name": store_host, "port": store_port},
        health_check=health,
        finalize=BeforeRestart(budget),
        rank_assignment=AllRanksOrNone(),
        soft_timeout=soft,
        hard_timeout=hard,
        heartbeat_timeout=datetime.timedelta(seconds=30),
        barrier_timeout=barrier,
        completion_timeout=barrier,
    )
    if not cuda and hasattr(wrapper, "restart_health_check"):
        # NVRx >= 0.5: GPU/NVLink checks are appended when LOCAL_RANK is set; they need NVML.
        wrapper.restart_health_check = health

    @wrapper
    def run(call_wrapper: Optional[inprocess.CallWrapper] = None) -> None:  # noqa: UP045 - see module doc
        train(Iteration(index=call_wrapper.iteration if call_wrapper else 0, call_wrapper=call_wrapper))

    return run


class RestartCauses:
    """The first failure of each in-process iteration, shared by all ranks through the job's store,
    so the restart is reported with its root cause rather than the timeouts it caused elsewhere."""

    def __init__(self, store: dist.Store, restart_count: int) -> None:
        self.store = store
        self.prefix = f"ftplane/causes/{restart_count}"

    def record(self, iteration: int, rank: int, cause: str) -> tuple[bool, str]:
        """Record our failure; returns (we were first, the recorded first cause)."""
        key = f"{self.prefix}/{iteration}"
        mine = f"rank {rank}: {cause}"[:2000]
        try:
            stored = self.store.compare_set(key, "", mine)
        except Exception as exc:  # the store's host (rank 0) may be the one that died
            log.debug("cannot record the restart cause: %s", exc)
            return True, mine
        first = stored.decode(errors="replace") if isinstance(stored, bytes) else str(stored)
        return first == mine, first

    def first(self, iteration: int) -> str | None:
        key = f"{self.prefix}/{iteration}"
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode(errors="replace")
        except Exception as exc:
            log.debug("cannot read the restart cause: %s", exc)
            return None


# --- 3. async checkpoints on CUDA -----------------------------------------------------------------


def _start_results_queue() -> threading.Thread | None:
    """Make NVRx's per-process results queue (a Manager process) on a thread of its own."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    create = getattr(filesystem_async, "get_write_results_queue", None)  # public from 0.7-ish
    if create is None and internals_read():
        create = getattr(filesystem_async, "_get_write_results_queue", None)
    if create is None:
        return None  # the first save makes it, while training waits
    thread = threading.Thread(target=create, name="nvrx-results-queue", daemon=True)
    thread.start()
    return thread


class NvrxAsyncSaver:
    """torch.distributed.checkpoint saves written by NVRx's async writer process (CUDA only)."""

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("NVRx's async checkpoint writer needs CUDA; on CPU use dcp.async_save")
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

        if not nvrx_version_matches(NVRX_FOR_CUDA):
            log.warning(
                "the async checkpoint writer is tested with nvidia-resiliency-ext %s, this is %s: "
                "install ftplane[gpu] (or that version) on GPU machines",
                NVRX_FOR_CUDA,
                NVRX_VERSION,
            )
        self.queue = AsyncCallsQueue(persistent=True)
        self._abandoned = False
        self._results_queue_started = _start_results_queue()
        takes = inspect.signature(FileSystemWriterAsync.__init__).parameters
        self._writer_options: dict[str, Any] = {"thread_count": 2}
        if "use_cached_data_structure" in takes:
            self._writer_options["use_cached_data_structure"] = True

    def warm_up(self, state_dict: dict[str, Any]) -> None:
        """Do, in the background, what the first save would otherwise do while training waits: start the
        writer process, map the state's GPU memory into it (CUDA IPC) and pin host memory for the copy.

        A save is planned into a scratch directory (a collective, as every save) and only its preload
        step is run, as a request of its own: NVRx's writer keeps the mapped tensors under the plan's
        key (`use_cached_data_structure`), and the planning side remembers that it did, so the first
        real save, of the same structure, sends no tensors and only copies. Nothing is written; the next
        save waits for this request if it has not finished."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest

        with tempfile.TemporaryDirectory(prefix="ftplane-writer-warm-up-") as scratch:
            _, _, preload_fn, _ = self._plan(state_dict, scratch)
        if preload_fn is not None:  # None: nothing to write on this rank
            self.queue.schedule_async_request(AsyncRequest(preload_fn, (), []))  # the staged copy is dropped

    def _plan(self, state_dict: dict[str, Any], path: str) -> tuple[Any, Callable | None, Callable | None, Any]:
        """DCP planning through NVRx's async writer: (planned, save_fn, preload_fn, save_args); the functions
        are None where this rank has nothing to write."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_plan
        from torch.distributed.checkpoint import DefaultSavePlanner

        if self._results_queue_started is not None:
            self._results_queue_started.join()  # a no-op unless this comes seconds after the start
        writer = FileSystemWriterAsync(path, **self._writer_options)
        planned = save_state_dict_async_plan(state_dict, writer, None, 0, planner=DefaultSavePlanner())
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        return planned, save_fn, preload_fn, save_args

    def schedule(self, state_dict: dict[str, Any], path: str, on_finalized: Callable[[], None]) -> dict[str, float]:
        """Plan and stage now (blocking part); the write runs in the background. `on_finalized`
        runs on every rank once all ranks' writes are done and the metadata is written. Returns the
        blocking part's stages in seconds: `plan` (DCP planning), `stage` (the writer's copy to host)."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_finalize

        started = time.monotonic()
        planned, save_fn, preload_fn, save_args = self._plan(state_dict, path)

        def finalize() -> None:
            save_state_dict_async_finalize(*planned)
            on_finalized()

        planned_at = time.monotonic()
        self.queue.schedule_async_request(AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn))
        return {"plan": planned_at - started, "stage": time.monotonic() - planned_at}

    def poll(self, blocking: bool = False) -> None:
        """Finalize the saves that are done (a collective: every rank calls it at the same step)."""
        if not self._abandoned:
            self.queue.maybe_finalize_async_calls(blocking=blocking, no_dist=False)

    @property
    def in_flight(self) -> int:
        return 0 if self._abandoned else self.queue.get_num_unfinalized_calls()

    def close(self) -> None:
        """Finalize what is left (a collective) and stop the writer process."""
        if not self._abandoned:
            self.queue.close()

    def abandon(self) -> None:
        """After a fault: stop the writer process without finalizing (no collectives with peers that
        may be gone); what was in flight never gets its completion marker, and this saver finalizes
        nothing more."""
        self._abandoned = True
        if "abort" in inspect.signature(self.queue.close).parameters:
            # Public from 0.7-ish: the writer process is stopped (SIGTERM, SIGKILL after NVRx's
            # timeout), nothing is finalized.
            self.queue.close(abort=True)
        elif internals_read():
            # 0.4.1: drop the unfinalized calls, then stop the writer (it finishes the write in
            # progress first).
            self.queue.async_calls.clear()
            caller = getattr(self.queue, "persistent_caller", None)
            if caller is not None:
                caller.close()
        else:
            log.warning(
                "nvidia-resiliency-ext %s: cannot stop the async checkpoint writer without finalizing; "
                "it ends with this process (what it was writing is never marked complete)",
                NVRX_VERSION,
            )
