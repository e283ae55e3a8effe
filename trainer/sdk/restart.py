"""Opt-in: NVRx's in-process restart around a training function, the cheapest rung of the ladder.

    def train() -> None:          # makes its process group, model, optimizer; resumes; trains;
        ...                       # destroys the process group before returning
    sdk.inprocess(train)()

With in-process restart on (the job spec's `resiliency.inprocess`, `FTPLANE_INPROCESS=1`), a
fault on any rank makes every rank leave `train` and enter it again in the same processes, in a
new iteration; `run.step()` feeds the Wrapper's progress watchdog. The SDK reports each failure
(`rank_failed`, the first failing rank named through the Wrapper's store) and each restart
(`inprocess_restart` from rank 0, with the first failure as its cause), and each iteration's
`running`. Spent budget, or a rank that cannot rejoin: every rank leaves, the process exits, and
ft_launcher's in-job restart takes over.

NVRx marks in-process restart deprecated from 0.6 on. ftplane keeps the rung while NVRx has it
and says so in a warning; with an NVRx that no longer has it, `train` runs once, unwrapped, with a
warning, and faults go to the next rung. Turned off, the same: `train` runs once, its failure
reported.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from ftplane.contract import Env
from ftplane.trainer.sdk.process_run import init
from ftplane.trainer.sdk.run import Run

log = logging.getLogger("ftplane.trainer.sdk")

_warned: set[str] = set()


def _warn_once(what: str, message: str, *args: object) -> None:
    if what not in _warned:
        _warned.add(what)
        log.warning(message, *args)


def _flag(text: str | None) -> bool:
    return (text or "").strip().lower() in ("1", "true", "yes", "on")


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    text = environ.get(name) or ""
    try:
        return float(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a number") from None


def inprocess(
    fn: Callable[[], None],
    run: Run | None = None,
    *,
    enabled: bool | None = None,
    soft_timeout_s: float | None = None,
    hard_timeout_s: float | None = None,
    max_iterations: int | None = None,
    store_host: str | None = None,
    store_port: int | None = None,
    cuda: bool | None = None,
    environ: Mapping[str, str] | None = None,
) -> Callable[[], None]:
    """`fn` to be called once, under NVRx's in-process restart when it is on and available.

    Every argument defaults to what the job spec sets: `enabled` (FTPLANE_INPROCESS), the Wrapper's
    soft and hard progress timeouts (FTPLANE_INPROCESS_SOFT_TIMEOUT_S, _HARD_TIMEOUT_S: 60, 90 s),
    the in-process restarts allowed (FTPLANE_INPROCESS_MAX_ITERATIONS: 10). The Wrapper's own store
    listens at `store_host` (FTPLANE_MASTER_ADDR, else MASTER_ADDR) port `store_port` (default: a free
    one the ranks agree on through the rendezvous store at MASTER_PORT when `fn`'s wrapper is called);
    `cuda` (default: whether CUDA is available) adds NVRx's CUDA health check.

    `fn` must not leave a default process group behind: the Wrapper needs none to exist when it
    (re-)enters `fn`.
    """
    env = os.environ if environ is None else environ
    the_run = run if run is not None else init()
    on = _flag(env.get(Env.INPROCESS)) if enabled is None else enabled

    def once() -> None:
        from ftplane.trainer.nvrx.inprocess_restart import Iteration

        the_run.enter_iteration(Iteration(index=0))
        try:
            fn()
        except BaseException as exc:
            the_run.failed(exc)
            raise

    if not on:
        return once
    from ftplane.trainer.nvrx import inprocess_restart, versions

    if not inprocess_restart.inprocess_available():
        _warn_once(
            "unavailable",
            "in-process restart is on, but NVRx %s has no inprocess.Wrapper (deprecated since 0.6): "
            "training runs without it, and a fault goes to the next rung (ft_launcher's in-job restart)",
            versions.NVRX_VERSION or "(version unknown)",
        )
        return once
    master_port = env.get("MASTER_PORT")
    if store_port is None and not master_port:
        _warn_once(
            "no-launcher",
            "in-process restart is on, but MASTER_PORT is not set (not started by a launcher): "
            "training runs without it",
        )
        return once
    _warn_once(
        "deprecated",
        "in-process restart: NVRx marks it deprecated since 0.6 (installed: %s); ftplane keeps the rung "
        "while NVRx has it and falls back to in-job restart where it does not",
        versions.NVRX_VERSION or "version unknown",
    )
    if cuda is None:
        import torch

        cuda = torch.cuda.is_available()
    soft = soft_timeout_s if soft_timeout_s is not None else _number(env, Env.INPROCESS_SOFT_TIMEOUT_S, 60.0)
    hard = hard_timeout_s if hard_timeout_s is not None else _number(env, Env.INPROCESS_HARD_TIMEOUT_S, 90.0)
    budget = max_iterations if max_iterations is not None else int(_number(env, Env.INPROCESS_MAX_ITERATIONS, 10))

    def iteration(it: inprocess_restart.Iteration) -> None:
        the_run.enter_iteration(it, store=getattr(it.call_wrapper, "base_store", None))
        try:
            fn()
        except BaseException as exc:
            the_run.failed(exc)
            raise
        finally:
            the_run.leave_iteration()

    return inprocess_restart.wrap_inprocess(
        iteration,
        store_host=store_host or env.get(Env.MASTER_ADDR) or env.get("MASTER_ADDR") or "127.0.0.1",
        store_port=store_port,
        rendezvous_port=int(master_port or 0),
        soft_timeout_s=soft,
        hard_timeout_s=hard,
        max_iterations=budget,
        cuda=cuda,
    )
