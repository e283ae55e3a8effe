"""Opt-in: checkpoints through torch.distributed.checkpoint, async by default, reported through the run.

    ckpt = sdk.checkpointer(run)                     # after the process group exists
    start = ckpt.load_latest(model, optimizer)       # reports checkpoint_loaded
    for ...:
        ...
        ckpt.poll()                                  # completes a finished background save
        if ckpt.due(n):
            ckpt.save(n, model, optimizer)           # blocks only to stage; reports checkpoint_saved when complete
        run.step(n, ...)
    ckpt.wait(); ckpt.close()

It is the built-in trainer's `ftplane.trainer.checkpoint.Checkpointer` (see that module: the layout, what
makes a checkpoint complete, which engine runs where: NVRx's async writer on CUDA, `dcp.async_save`
on the CPU), wired to the run: rank 0 reports each completed save with its blocking and total
seconds and its size, which goodput reads as checkpoint stalls.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ftplane.contract import Env
from ftplane.trainer.sdk.process_run import init
from ftplane.trainer.sdk.run import Run

if TYPE_CHECKING:
    import torch

    from ftplane.trainer.checkpoint import Checkpointer


def checkpointer(
    run: Run | None = None,
    *,
    root: str | Path | None = None,
    engine: str | None = None,
    interval: int | None = None,
    keep: int | None = None,
    rank: int | None = None,
    device: torch.device | None = None,
    environ: Mapping[str, str] | None = None,
) -> Checkpointer:
    """A Checkpointer reporting through `run` (default: the process's run). Each argument defaults to
    the job spec's, from the environment: `root` FTPLANE_CHECKPOINT_DIR (none: no checkpoints),
    `engine` FTPLANE_CHECKPOINT_ENGINE (else async), `interval` FTPLANE_CHECKPOINT_INTERVAL (else 100
    steps), `keep` FTPLANE_CHECKPOINT_KEEP (else 2). `rank` defaults to torch.distributed's,
    `device` to this rank's GPU when CUDA is available, else the CPU. Every rank calls it, after
    the process group is made (the async engine makes a group of its own)."""
    import torch
    import torch.distributed as dist

    from ftplane.trainer.checkpoint import Checkpointer

    env = os.environ if environ is None else environ
    the_run = run if run is not None else init()

    def number(name: str, default: int) -> int:
        text = env.get(name) or ""
        try:
            return int(text) if text else default
        except ValueError:
            raise ValueError(f"{name}={text!r}: expected an integer") from None

    directory = root if root is not None else env.get(Env.CHECKPOINT_DIR) or None
    if device is None:
        device = torch.device("cuda", the_run.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    return Checkpointer(
        Path(directory) if directory else None,
        engine=engine or env.get(Env.CHECKPOINT_ENGINE) or "async",
        interval=interval if interval is not None else number(Env.CHECKPOINT_INTERVAL, 100),
        keep=keep if keep is not None else number(Env.CHECKPOINT_KEEP, 2),
        rank=rank if rank is not None else (dist.get_rank() if dist.is_initialized() else the_run.rank),
        reporter=the_run,
        device=device,
    )
