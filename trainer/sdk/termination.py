"""Learning that this rank is being stopped (SIGTERM), so a training loop can save before it ends.

When a pod is evicted, drained or cancelled, the node agent passes SIGTERM to ft_launcher, which passes it to
the ranks and kills them only after the job's `resiliency.stop_grace_s` (FTPLANE_STOP_GRACE_S). By default
Python ends at SIGTERM; a loop that calls `install()` is told instead:

    from ftplane.sdk import termination

    termination.install()
    for step in ...:
        ...
        if termination.agreed():                # or `run.should_stop()`: the same
            ckpt.save(step, model, optimizer)   # within termination.seconds_left()
            ckpt.wait()
            break
    ...
    if termination.agreed_stop():
        termination.end()                       # stopped, not finished

Only the pods being stopped get SIGTERM (one evicted node, say), yet a distributed save needs every rank:
`agreed()` is a collective (every rank calls it at the same step) that is true on all ranks once any of them
was told to stop, so they all save the same step and end. `requested()` is this rank's own flag.
`end()` then ends the process so that a stopped rank is never taken for a finished one (a pod that exits 0
counts as a Succeeded index of the Job): 0 where it was told (its node agent, told too, reports the node
stopped), by SIGTERM where it stopped only for the others.

`install` must be called from the main thread; a second SIGTERM, or SIGTERM before `install`, ends the process
as usual. Nothing else changes: without `install` a rank ends at SIGTERM as it always did.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from ftplane.contract import Env

if TYPE_CHECKING:
    import torch.distributed as dist

_requested = threading.Event()
_agreed = threading.Event()  # some rank was told to stop, and every rank knows it (`agreed()`)
_deadline: list[float] = []


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    if _requested.is_set():  # told twice: end now, as Python would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    grace = float(os.environ.get(Env.STOP_GRACE_S) or 10.0)
    _deadline[:] = [time.monotonic() + grace]
    _requested.set()


def install() -> None:
    """From now on SIGTERM sets `requested()` instead of ending the process (once; a second one ends it)."""
    signal.signal(signal.SIGTERM, _on_sigterm)


def requested() -> bool:
    """Whether this rank has been told to stop."""
    return _requested.is_set()


def seconds_left() -> float | None:
    """Seconds before the rank is killed (None while no stop was asked), by the job's stop grace."""
    return max(0.0, _deadline[0] - time.monotonic()) if _deadline else None


def agreed(group: dist.ProcessGroup | None = None) -> bool:
    """Whether any rank of `group` (default: the whole job) has been told to stop: a collective, every rank calls
    it at the same step, and all get the same answer (a maximum over the ranks' flags). Without a process group
    it is `requested()`. Once true it stays true, and `agreed_stop()` says so without a collective."""
    if _agreed.is_set():
        return True
    import torch
    import torch.distributed as dist

    told = requested()
    if dist.is_available() and dist.is_initialized():
        # NCCL reduces device tensors only; gloo (or a gloo part of a mixed backend) host ones.
        on_cuda = "nccl" in str(dist.get_backend(group)) and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
        flag = torch.tensor([1 if told else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        told = bool(flag.item())
    if told:
        _agreed.set()
    return told


def agreed_stop() -> bool:
    """Whether `agreed()` has said stop in this process (no collective)."""
    return _agreed.is_set()


def end() -> NoReturn:
    """End this process as a stopped rank, after its save. A rank told to stop exits 0: it did what was asked,
    its launcher ends well, and the node agent that passed SIGTERM on reports the node stopped (128 + SIGTERM),
    not finished. A rank that stopped only because another was told (`agreed()`) ends by SIGTERM, as its
    launcher's teardown would end it: its node was not stopped, so it must not read as finished either."""
    sys.stdout.flush()
    sys.stderr.flush()
    if requested():
        os._exit(0)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # not the main thread: the handler stays, so end as a shell would say SIGTERM ended it
        os._exit(128 + signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5.0)  # delivered at once; should it somehow not be, exit as a shell would say it
    os._exit(128 + signal.SIGTERM)
