"""The process's one run: `init()` makes it from the environment on the first call, `current()` returns it."""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ftplane.trainer.agent.protocol import SOCKET_ENV
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.run import FAILURE_FLUSH_S, Run

if TYPE_CHECKING:
    import torch.distributed as dist

log = logging.getLogger("ftplane.trainer.sdk")

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
        if _current is not None and not _current.finished:
            if total_steps is not None:
                _current.total_steps = total_steps
            if store is not None and _current.causes is None:
                _current.share_failures(store)
            return _current
        env = Environment.read(environ)
        run = Run(env, total_steps=total_steps, interval_s=interval_s, nvrx_heartbeats=nvrx_heartbeats, store=store)
        if report_uncaught:
            run.report_uncaught_exceptions()
        atexit.register(run.finish, FAILURE_FLUSH_S)
        _current = run
    if not run.enabled:
        log.debug("ftplane reporting is off (no %s or FTPLANE_URL): the SDK's reports are no-ops", SOCKET_ENV)
    return run


def current() -> Run | None:
    """The run `init()` made in this process, if any (and not finished)."""
    return _current if _current is not None and not _current.finished else None
