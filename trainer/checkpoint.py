"""Checkpoints through torch.distributed.checkpoint (DCP), with three engines.

- `sync`: `dcp.save`; the step blocks for the whole save.
- `async`: the step blocks only to stage the state; the write goes on in the
  background. On CUDA through NVRx's async writer (`nvrx.async_checkpoint.NvrxAsyncSaver`), on
  the CPU through `dcp.async_save` over a gloo group of its own.
- `none`: no checkpoint is written or read.

Layout: `<dir>/step-<8 digits>/` holds one DCP checkpoint (the state after that
many steps). A checkpoint is *complete* only once rank 0 has written
`ftplane-complete.json` into it, which happens after every rank's data and
DCP's `.metadata` are on disk (for async saves: when the background save has
finished on all ranks). A directory without the marker -- a rank died mid-save,
an async save never finished -- is never loaded and is deleted once a newer
checkpoint is complete. The newest `keep` complete checkpoints are kept; older
ones are deleted on a background thread (deleting tens of GB takes seconds), never
on the training thread.

Each checkpoint names the job that wrote it (`ftplane-owner.json`, written by rank 0
before the save, and the complete marker): a Checkpointer loads, and deletes, only its
own job's (FTPLANE_JOB_ID; none outside a job), so even two jobs given the same
directory never resume from, nor delete, each other's. The backends give each job a
directory of its own anyway (workers/backends/checkpoint_storage.py). A job started
with `checkpoint.resume_from` gets the other job's directory too, read-only
(FTPLANE_CHECKPOINT_RESUME_FROM): when its own directory has no complete checkpoint
yet, it loads the newest complete one there, and never writes or deletes anything in it.

Rank 0 reports `checkpoint_saved` (step, blocking and total seconds, bytes: what
goodput reads) and `checkpoint_loaded` through an `EventSink` (trainer/sdk/sink.py;
the SDK's run is one, and `ftplane.trainer.sdk.checkpointer(run)` builds a Checkpointer
wired to it).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from ftplane.contract import Env, EventType
from ftplane.trainer.checkpoint_layout import (
    COMPLETE_MARKER,
    OWNER_FILE,
    CheckpointInfo,
    directory_bytes,
    is_complete,
    latest_complete,
    list_checkpoints,
    owner_of,
    rotate,
    step_dir,
    write_json,
)
from ftplane.trainer.sdk.sink import checkpoint_saved_details

__all__ = [  # the layout's names, for the code that has always imported them from here
    "COMPLETE_MARKER",
    "Checkpointer",
    "CheckpointInfo",
    "is_complete",
    "latest_complete",
    "list_checkpoints",
    "local_tensors",
    "rotate",
    "step_dir",
]

if TYPE_CHECKING:
    from ftplane.trainer.sdk.sink import EventSink

log = logging.getLogger(__name__)

ENGINES = ("sync", "async", "none")


def local_tensors(state: Any, device_type: str) -> list[torch.Tensor]:
    """Every tensor on `device_type` in a (nested) state dict, DTensors as their local shard."""
    if isinstance(state, DTensor):
        state = state.to_local()
    if isinstance(state, torch.Tensor):
        return [state] if state.device.type == device_type else []
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else ()
    return [t for value in values for t in local_tensors(value, device_type)]


@dataclass
class _InFlight:
    step: int
    path: Path
    started: float
    blocking_s: float
    future: Future[Any] | None = None  # dcp.async_save
    finalized: bool = False  # NVRx: set by the finalize callback
    stages: dict[str, float] | None = None  # NVRx: where the blocking time went


class Checkpointer:
    def __init__(
        self,
        root: Path | None,
        *,
        engine: str,
        interval: int,
        keep: int,
        rank: int,
        reporter: EventSink,
        device: torch.device,
        job_id: str | None = None,
        resume_from: Path | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        """`job_id` (default FTPLANE_JOB_ID) owns what this Checkpointer writes; `resume_from` (default
        FTPLANE_CHECKPOINT_RESUME_FROM) is another job's directory to start from, read-only."""
        env = os.environ if environ is None else environ
        if engine not in ENGINES:
            raise ValueError(f"checkpoint engine {engine!r} is not one of {', '.join(ENGINES)}")
        self.engine = engine if root is not None else "none"
        self.root = root
        self.interval = interval
        self.keep = keep
        self.rank = rank
        self.reporter = reporter
        self.device = device
        self._in_flight: _InFlight | None = None
        self._nvrx = None
        self._group: dist.ProcessGroup | None = None
        self._janitor: ThreadPoolExecutor | None = None  # rank 0: rotation off the training thread
        self.last_saved_step: int | None = None
        self.job_id = job_id if job_id is not None else env.get(Env.JOB_ID) or None
        resume = resume_from if resume_from is not None else env.get(Env.CHECKPOINT_RESUME_FROM) or None
        self.resume_from = Path(resume) if resume else None
        if self.engine == "async":
            if device.type == "cuda":
                from ftplane.trainer.nvrx.async_checkpoint import NvrxAsyncSaver

                self._nvrx = NvrxAsyncSaver()
            else:
                # The background thread's collectives must not share a gloo group with training's.
                self._group = dist.new_group(backend="gloo")
        if self.engine != "none" and rank == 0:
            assert root is not None
            root.mkdir(parents=True, exist_ok=True)
            self._janitor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-rotate")

    @property
    def enabled(self) -> bool:
        return self.engine != "none"

    # --- loading ------------------------------------------------------------------------------------

    def _choose(self) -> CheckpointInfo | None:
        """Rank 0: this job's newest complete checkpoint (its newer incomplete ones deleted: they would be written
        into again), else the newest complete one of the job it resumes from (read-only: nothing deleted there)."""
        assert self.root is not None
        present = list_checkpoints(self.root)
        own = [c for c in present if c.owner == self.job_id]
        complete = [c for c in own if c.complete]
        latest = complete[-1] if complete else None
        for c in own:
            if not c.complete and (latest is None or c.step > latest.step):
                log.warning("skipping incomplete checkpoint %s (deleted)", c.path)
                shutil.rmtree(c.path, ignore_errors=True)
        skipped = len(present) - len(own)
        if skipped:
            log.warning(
                "%d checkpoint(s) under %s belong to another job: neither loaded nor deleted", skipped, self.root
            )
        if latest is None and self.resume_from is not None:
            latest = latest_complete(self.resume_from)
            if latest is None:
                log.warning("checkpoint.resume_from: no complete checkpoint under %s; starting fresh", self.resume_from)
        return latest

    def load_latest(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the newest complete checkpoint (rank 0 picks it for everyone); returns its step, or 0."""
        if not self.enabled:
            return 0
        assert self.root is not None
        choice: list[tuple[int, str, str | None] | None] = [None]
        if self.rank == 0:
            latest = self._choose()
            choice = [None if latest is None else (latest.step, str(latest.path), latest.owner)]
        dist.broadcast_object_list(choice, src=0)  # also the barrier after the clean-up above
        if choice[0] is None:
            return 0
        step, path, owner = choice[0]
        started = time.monotonic()
        model_state, optim_state = get_state_dict(model, optimizer)
        dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=path)  # in place
        set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optim_state)
        load_s = time.monotonic() - started
        self.last_saved_step = step
        if self.rank == 0:
            log.info("resumed from %s (step %d) in %.2f s", path, step, load_s)
            details: dict[str, Any] = {"step": step, "path": path, "load_s": round(load_s, 4), "engine": self.engine}
            if owner != self.job_id:
                details["from_job"] = owner  # checkpoint.resume_from: another job's checkpoint, read-only
            self.reporter.event(
                EventType.checkpoint_loaded,
                details=details,
                step=step,
                rank=self.rank,
            )
        return step

    # --- saving -------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.enabled and step % self.interval == 0 and step != self.last_saved_step

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Save the state after `step` steps (every rank calls this at the same step)."""
        if not self.enabled:
            return
        assert self.root is not None
        # The loop is held from here: waiting for the previous save (or the writer's warm-up) is part of this
        # save's blocking time, or goodput would count it as training.
        started = time.monotonic()
        self.wait()  # one save at a time: the next may not start before the previous is complete
        path = step_dir(self.root, step)
        if self.rank == 0:  # before any rank writes: an incomplete checkpoint is known to be this job's too
            other = owner_of(path) if path.is_dir() else None  # (another rank may have made it: unowned)
            if other is not None and other != self.job_id:
                raise RuntimeError(
                    f"{path} holds a checkpoint of job {other}: refusing to write over it; give each job "
                    "a checkpoint directory of its own"
                )
            path.mkdir(parents=True, exist_ok=True)
            write_json(path, OWNER_FILE, {"job_id": self.job_id, "step": step})
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        self.last_saved_step = step
        if self.engine == "sync":
            dcp.save(state, checkpoint_id=str(path))
            self._complete(step, path, started=started, blocking_s=None)  # blocked until marked complete
        elif self._nvrx is not None:
            in_flight = _InFlight(step, path, started, 0.0)

            def finalized() -> None:
                in_flight.finalized = True
                self._complete(step, path, started=started, blocking_s=in_flight.blocking_s, stages=in_flight.stages)

            path.mkdir(parents=True, exist_ok=True)
            in_flight.stages = self._nvrx.schedule(state, str(path), finalized)
            in_flight.blocking_s = time.monotonic() - started
            self._in_flight = in_flight
        else:
            result: Any = dcp.async_save(state, checkpoint_id=str(path), process_group=self._group)
            future: Future[Any] = getattr(result, "upload_completion", result)  # AsyncSaveResponse on newer torch
            self._in_flight = _InFlight(step, path, started, time.monotonic() - started, future=future)

    def poll(self) -> None:
        """Once per step on every rank: complete the async save that has finished, if any."""
        if self._nvrx is not None:
            self._nvrx.poll(blocking=False)
            if self._in_flight is not None and self._in_flight.finalized:
                self._in_flight = None
        elif self._in_flight is not None and self._in_flight.future is not None and self._in_flight.future.done():
            self._finish_future()

    def wait(self) -> None:
        """Block until the save in flight (if any) is complete."""
        if self._nvrx is not None:
            if self._nvrx.in_flight:
                self._nvrx.poll(blocking=True)
            self._in_flight = None
        elif self._in_flight is not None and self._in_flight.future is not None:
            self._finish_future()

    def warm_up(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Once the optimizer has state (after the first step): have the NVRx writer set up, in the
        background, what its first save would otherwise set up while training waits (see
        `NvrxAsyncSaver.warm_up`). Every rank calls this at the same step (it plans a save)."""
        if self._nvrx is None:
            return
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state}
        self._nvrx.warm_up(state)
        if self.rank == 0:
            tensors = local_tensors(state, self.device.type)
            log.info(
                "async checkpoint writer: warming up on %d tensors, %.2f GB",
                len(tensors),
                sum(t.nbytes for t in tensors) / 1e9,
            )

    def close(self) -> None:
        if self._nvrx is not None:
            self._nvrx.close()
        if self._janitor is not None:
            self._janitor.shutdown(wait=True)

    def abandon(self) -> None:
        """After a fault: whatever save is in flight is never completed (so never loaded)."""
        self._in_flight = None
        if self._janitor is not None:
            self._janitor.shutdown(wait=False)  # a deletion under way finishes; none is started
        if self._nvrx is not None:
            try:
                self._nvrx.abandon()
            except Exception as exc:
                log.warning("stopping the async checkpoint writer: %s", exc)

    def _finish_future(self) -> None:
        in_flight = self._in_flight
        assert in_flight is not None and in_flight.future is not None
        self._in_flight = None
        try:
            in_flight.future.result()
        except Exception as exc:
            log.error("async checkpoint of step %d failed (%s); it stays incomplete", in_flight.step, exc)
            return
        self._complete(in_flight.step, in_flight.path, started=in_flight.started, blocking_s=in_flight.blocking_s)

    def _complete(
        self,
        step: int,
        path: Path,
        *,
        started: float,
        blocking_s: float | None,
        stages: dict[str, float] | None = None,
    ) -> None:
        """Every rank's part is on disk: rank 0 marks the checkpoint complete, reports it, and has the
        checkpoints beyond `keep` deleted in the background. `blocking_s` None: the training thread was
        held from `started` until now (a sync save). `stages`: where the blocking time went."""
        if self.rank != 0:
            return
        assert self.root is not None and self._janitor is not None
        size = directory_bytes(path)
        total_s = time.monotonic() - started
        if blocking_s is None:
            blocking_s = total_s
        write_json(
            path,
            COMPLETE_MARKER,
            {
                "job_id": self.job_id,
                "step": step,
                "engine": self.engine,
                "bytes": size,
                "blocking_s": blocking_s,
                "total_s": total_s,
                "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                "completed_at": datetime.now(UTC).isoformat(),
            },
        )
        self._janitor.submit(self._rotate)
        log.info(
            "checkpoint step %d complete: %s, %.1f kB, blocked %.3f s%s, total %.3f s",
            step,
            path,
            size / 1e3,
            blocking_s,
            " (" + ", ".join(f"{k} {v:.3f} s" for k, v in stages.items()) + ")" if stages else "",
            total_s,
        )
        details = checkpoint_saved_details(
            step, blocking_s=blocking_s, total_s=total_s, bytes=size, engine=self.engine, path=str(path)
        )
        if stages:
            details["blocking_stages_s"] = {k: round(v, 4) for k, v in stages.items()}
        self.reporter.event(EventType.checkpoint_saved, details=details, step=step, rank=self.rank)

    def _rotate(self) -> None:
        assert self.root is not None
        started = time.monotonic()
        try:
            deleted = rotate(self.root, self.keep, self.job_id)
        except Exception as exc:  # a failed deletion must not stop the next ones
            log.warning("deleting old checkpoints under %s failed: %s", self.root, exc)
            return
        if deleted:
            log.info("deleted %d old checkpoint(s) in %.2f s", len(deleted), time.monotonic() - started)
