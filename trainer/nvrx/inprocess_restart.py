"""In-process restart (NVRx's inprocess): the training function runs inside `inprocess.Wrapper`; on a
fault on any rank it is re-entered in the same processes (a new process group per iteration, state
reloaded from the latest checkpoint). `Iteration.ping()` feeds the Wrapper's progress watchdog. The SDK's
`inprocess` helper (trainer/sdk/restart.py) is what calls it.

- NVRx marks in-process restart deprecated from 0.6 on: `inprocess_available()` says whether the
  installed NVRx still has the Wrapper. Where it does not, the policy classes below stand on plain
  bases, unused.
- From 0.5-ish the Wrapper appends GPU and NVLink health checks (NVML) to the restart health check
  whenever LOCAL_RANK is set, which ft_launcher always sets. They fail on a machine without NVML, so on
  CPU the trainer replaces `restart_health_check` with its own checks (guarded by `hasattr`).
- The Wrapper's store is given an explicit host, never MASTER_ADDR (which ft_launcher sets to a local
  name), and a port the ranks agree on at start (`agreed_store_port`).

This module deliberately does not use `from __future__ import annotations`: the Wrapper finds the
parameter that receives its `CallWrapper` by evaluating annotations.
"""

import datetime
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

import torch.distributed as dist

try:
    from nvidia_resiliency_ext import inprocess as _inprocess

    inprocess: Any = _inprocess
except ImportError:  # pragma: no cover - an NVRx without in-process restart
    inprocess = None

log = logging.getLogger(__name__)


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


class RestartBudget(_HealthCheck):  # type: ignore[misc]  # NVRx's base class (Any), or object without in-process restart
    """Refuse a restart after `max_iterations` in-process restarts: every rank then leaves the
    Wrapper and the process exits, so the next rung (ft_launcher's in-job restart) takes over.

    NVRx runs health checks before every iteration and again before a restart; only the latter
    counts. `BeforeRestart` (the Wrapper's `finalize`, which runs only on the restart path) tells
    them apart. Every rank counts the same iterations, so all refuse together."""

    def __init__(self, max_iterations: int) -> None:
        self.max_iterations = max_iterations
        self.restarting = False

    def __call__(self, state: Any) -> Any:  # NVRx's FrozenState
        restarting, self.restarting = self.restarting, False
        if restarting and state.iteration + 1 > self.max_iterations:
            raise RuntimeError(
                f"in-process restart budget spent ({self.max_iterations} restart(s)); leaving recovery to ft_launcher"
            )
        return state


class BeforeRestart(_Finalize):  # type: ignore[misc]  # NVRx's base class (Any), or object without in-process restart
    def __init__(self, budget: RestartBudget) -> None:
        self.budget = budget

    def __call__(self, state: Any) -> Any:
        self.budget.restarting = True
        return state


class AllRanksOrNone(_RankAssignment):  # type: ignore[misc]  # NVRx's base class (Any), or object without in-process restart
    """Restart in process only with the whole world. NVRx's default would shrink the world around a
    rank that left (terminated, or gone on to the next rung); FSDP's sharding and the per-rank data
    would then silently change. Instead every rank leaves the Wrapper, and ft_launcher restarts the
    worker group at full size."""

    def __init__(self) -> None:
        self.assign = inprocess.Compose(
            inprocess.rank_assignment.ActivateAllRanks(), inprocess.rank_assignment.ShiftRanks()
        )

    def __call__(self, ctx: Any) -> Any:  # NVRx's RankAssignmentCtx
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


def agreed_store_port(
    host: str, rendezvous_port: int, environ: Mapping[str, str] = os.environ, timeout_s: float = 300.0
) -> int:
    """A free port for the Wrapper's own store, the same on every rank: rank 0 takes one the kernel gives it and
    says which through the job's rendezvous store at `rendezvous_port` (MASTER_PORT, shared with whatever else
    uses it there, as torch's env:// rendezvous shares it); it waits until every rank has read it, so the
    rendezvous store can be let go at once.

    Not MASTER_PORT + 1, which nobody had promised: where another socket held that port, rank 0's store could
    not listen on it, NVRx's store fell back to being a client of it, and every rank waited on a store that was
    not there until ft_launcher killed them as hung (a full suite run met it after an in-job restart)."""
    rank, world_size = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    key = f"ftplane/inprocess-store/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    store = dist.TCPStore(
        host,
        rendezvous_port,
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
        multi_tenant=True,
    )
    if rank != 0:
        port = int(store.get(key))
        store.set(f"{key}/read/{rank}", "1")
        return port
    with socket.socket() as free:
        free.bind(("", 0))  # free on every address, as the store's server listens on every address
        port = int(free.getsockname()[1])
    store.set(key, str(port))
    if world_size > 1:
        store.wait([f"{key}/read/{r}" for r in range(1, world_size)])
    return port


def wrap_inprocess(
    train: Callable[[Iteration], None],
    *,
    store_host: str,
    store_port: int | None,
    rendezvous_port: int,
    soft_timeout_s: float,
    hard_timeout_s: float,
    max_iterations: int,
    cuda: bool,
) -> Callable[[], None]:
    """`train` wrapped in NVRx's in-process restart, configured from the job spec. The Wrapper's
    store is its own, at `store_host:store_port` (rank 0 hosts it); with no `store_port`, at one the
    ranks agree on through the rendezvous store at `rendezvous_port` when the wrapped function is called."""
    soft = datetime.timedelta(seconds=soft_timeout_s)
    hard = datetime.timedelta(seconds=hard_timeout_s)
    barrier = max(datetime.timedelta(seconds=120), hard + datetime.timedelta(seconds=30))
    budget = RestartBudget(max_iterations)
    health = budget
    if cuda:
        health = inprocess.Compose(inprocess.health_check.CudaHealthCheck(), budget)

    store_kwargs: dict[str, Any] = {"host_name": store_host, "port": store_port}
    wrapper = inprocess.Wrapper(
        store_kwargs=store_kwargs,
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

    def run(call_wrapper: Optional[inprocess.CallWrapper] = None) -> None:  # noqa: UP045 - see module doc
        train(Iteration(index=call_wrapper.iteration if call_wrapper else 0, call_wrapper=call_wrapper))

    wrapped: Callable[[], None] = wrapper(run)
    if store_port is not None:
        return wrapped

    def agree_then_run() -> None:
        # The Wrapper builds its store (and its monitor process's) from this dict when it is called.
        store_kwargs["port"] = agreed_store_port(store_host, rendezvous_port)
        wrapped()

    return agree_then_run


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
