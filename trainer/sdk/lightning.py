"""ftplane for PyTorch Lightning (the `lightning` package, 2.x): one callback, one line.

    from ftplane.sdk.lightning import FtplaneCallback

    trainer = pl.Trainer(..., callbacks=[ModelCheckpoint(..., save_last=True), FtplaneCallback()])
    trainer.fit(model, data, ckpt_path="last")

What it reports through the rank's run (trainer/sdk/run.py), with nothing timed by hand:

- `running` when training starts, at the global step it resumed from (after Lightning restored it);
  the total (`max_steps`, else Lightning's estimate of the optimizer steps), so progress and ETA work;
- every optimizer step with its loss (read at most once per heartbeat interval: one device sync
  each) and throughput (`tokens_per_step`, default the batch's size: samples per second per rank);
- each checkpoint once it is written: the callback wraps the strategy's CheckpointIO, so a save's
  blocking time runs from Lightning's `on_save_checkpoint` to the end of the last write of that
  step (`last.ckpt` included) on the rank that writes, with the bytes written; a strategy that
  writes without CheckpointIO is timed up to the next hook (Lightning's barrier follows each save);
- the checkpoint it resumed from (`checkpoint_loaded`, with the load's seconds), and an exception
  that ends `fit` (`rank_failed`);
- validation and checkpoint saves as phases (trainer/sdk/phases.py): no hang while they run.

Stopping (an eviction, a drain, a cancel): from `on_train_start` the callback holds SIGTERM for the rank
(trainer/sdk/termination.py; Lightning's own handler would end `fit` unsaved at the next epoch's end). At
the end of every optimizer step the ranks agree whether any of them was told (`run.should_stop()`: one
small all-reduce per step); if one was, the checkpoint callback saves that step (`last.ckpt`, as
`save_last` names it) and `trainer.should_stop` ends `fit`, within the job's `resiliency.stop_grace_s`.
The script's code after `fit` then runs; `if sdk.termination.agreed_stop(): sdk.termination.end()` ends
the rank as stopped, not finished. `stop_on_sigterm=False` leaves SIGTERM to Lightning.

A fault injected `at_step: N` fires when step N+1 is about to start (`on_train_batch_start`), after
ModelCheckpoint wrote the checkpoint of step N: Lightning runs checkpoint callbacks after all others in
`on_train_batch_end`, so a fault fired there would precede the save.

Zero code: with the job spec's `progress: {preset: lightning}` the node agent gives the ranks
FTPLANE_PROGRESS_PRESET=lightning, and Lightning adds `StepLog` to every Trainer through ftplane's entry
point (group `lightning.pytorch.callbacks_factory`, `progress_callbacks` below; ftplane must be
installed where the ranks run, which it is wherever its node agent is). StepLog only prints, on every
rank, `[ftplane] global_step=N total=T` as training starts and then at most once a second (and at the
end): what the preset's pattern reads (trainer/agent/presets.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.utilities.data import extract_batch_size

from ftplane.contract import Env
from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.process_run import init
from ftplane.trainer.sdk.run import Run

log = logging.getLogger("ftplane.trainer.sdk")

STEP_LOG_INTERVAL_S = 1.0
LOSS_READ_INTERVAL_S = 0.5
PRESET = "lightning"


def total_steps(trainer: pl.Trainer) -> int | None:
    """The optimizer steps `fit` will run: `max_steps`, else Lightning's own estimate (None if unbounded)."""
    if trainer.max_steps and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        estimate = trainer.estimated_stepping_batches
    except Exception:  # no dataloader length, an iterable dataset
        return None
    return int(estimate) if estimate not in (None, float("inf")) else None


class _ReportingCheckpointIO(CheckpointIO):
    """The strategy's CheckpointIO, timed: each write's end and size, and each load, told to the callback."""

    def __init__(self, inner: CheckpointIO, callback: FtplaneCallback) -> None:
        self.inner = inner
        self.callback = callback

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.callback._written(str(path))

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        started = time.perf_counter()
        checkpoint: dict[str, Any] = self.inner.load_checkpoint(path, map_location, weights_only)
        step = checkpoint.get("global_step")
        if isinstance(step, int):
            self.callback._loaded = (step, time.perf_counter() - started, str(path))
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class FtplaneCallback(Callback):
    """Reports a Lightning `fit` to ftplane (see the module's docstring). Every argument is optional:

    total_steps      the run's length (default: max_steps, else Lightning's estimate)
    tokens_per_step  a number, or a function of the batch, for throughput (default: the batch's size)
    run              the SDK run to report through (default: `ftplane.sdk.init()`'s)
    phase_timeout_s  how long a validation or a save may go without steps before it may be a hang
    stop_on_sigterm  on SIGTERM, save the step and end `fit` (default); False leaves SIGTERM to Lightning
    """

    def __init__(
        self,
        *,
        total_steps: int | None = None,
        tokens_per_step: float | Callable[[Any], float] | None = None,
        run: Run | None = None,
        phase_timeout_s: float | None = None,
        stop_on_sigterm: bool = True,
    ) -> None:
        self.total_steps = total_steps
        self.tokens_per_step = tokens_per_step
        self.phase_timeout_s = phase_timeout_s
        self.stop_on_sigterm = stop_on_sigterm
        self._run = run
        self.stopped_at: int | None = None  # the step a SIGTERM ended `fit` at
        self._reported_step = -1
        self._loss_read_at = 0.0
        self._loaded: tuple[int, float, str] | None = None  # (step, seconds, path) of the checkpoint loaded
        self._save_step: int | None = None  # the step whose checkpoint is being saved
        self._save_began = 0.0
        self._writes: list[tuple[float, str]] = []  # (end, path) of this save's files, on the rank that writes

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = init()
        return self._run

    # --- Lightning's hooks --------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _ReportingCheckpointIO):
            trainer.strategy.checkpoint_io = _ReportingCheckpointIO(io, self)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        run = self.run
        run.total_steps = self.total_steps or total_steps(trainer)
        if self._loaded is not None and trainer.is_global_zero:
            step, seconds, path = self._loaded
            run.checkpoint_loaded(step, load_s=seconds, path=path)
        self._loaded = None
        self._reported_step = trainer.global_step
        if self.stop_on_sigterm and threading.current_thread() is threading.main_thread():
            termination.install()  # in place of the handler Lightning set as `fit` began (it restores its own)
        run.start(trainer.global_step, {"framework": "lightning"})

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, idx: int) -> None:
        self._report_save()
        self.run.before_step(trainer.global_step)  # the checkpoint of this step, if any, is written

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        step = trainer.global_step
        if step <= self._reported_step:
            return  # a batch of gradient accumulation: no optimizer step yet
        self._reported_step = step
        self.run.step(step, loss=self._loss(outputs), tokens=self._tokens(batch), inject=False)
        # every rank asks at the same step: all of them stop, and save, if any was told to
        if not self.stop_on_sigterm or self.stopped_at is not None:
            return
        if self.run.should_stop():
            self._stop(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_save()
        self.run.phases.begin("validation", self.phase_timeout_s)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.run.phases.end()

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self._save_step != trainer.global_step:
            self._report_save()
            self._save_step, self._save_began, self._writes = trainer.global_step, time.perf_counter(), []
        self.run.phases.begin("checkpoint", self.phase_timeout_s)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_save()

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report_save()  # ModelCheckpoint's own on_train_end (a final last.ckpt) runs after ours
        self.run.flush(2.0)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.run.phases.end()
        self.run.failed(exception)

    # --- what the hooks measure ---------------------------------------------------------------------

    def _stop(self, trainer: pl.Trainer) -> None:
        """A rank was told to stop: the checkpoint callback saves this step (a save of every rank), `fit` ends."""
        self.stopped_at = trainer.global_step
        trainer.should_stop = True
        log.warning("rank %d: stopping at step %d (SIGTERM): saving, then ending fit", self.run.rank, self.stopped_at)
        checkpoint = trainer.checkpoint_callback
        if not isinstance(checkpoint, ModelCheckpoint) or checkpoint.dirpath is None:
            log.warning("no ModelCheckpoint to save the stop's step with: fit ends unsaved")
            return
        # Through the callback's own save, so that it counts the step saved (no second save of it) and names the
        # file as `save_last` does; found by `fit(ckpt_path="last")` either way.
        candidates = checkpoint._monitor_candidates(trainer)
        if checkpoint.save_last == "link":  # last links to the newest file saved: this step's
            checkpoint._save_checkpoint(trainer, checkpoint.format_checkpoint_name(candidates))
            checkpoint._save_last_checkpoint(trainer, candidates)
        elif checkpoint.save_last:
            checkpoint._save_last_checkpoint(trainer, candidates)
        else:
            name = checkpoint.format_checkpoint_name(candidates, checkpoint.CHECKPOINT_NAME_LAST)
            checkpoint._save_checkpoint(trainer, name)

    def _written(self, path: str) -> None:
        self._writes.append((time.perf_counter(), path))

    def _report_save(self) -> None:
        """The save under way is over (a hook after it runs): report it where it was written."""
        if self._save_step is None:
            return
        step, began, writes = self._save_step, self._save_began, self._writes
        self._save_step, self._writes = None, []
        self.run.phases.end()
        if not writes:
            if self.run.rank != 0:
                return  # this rank wrote nothing: the rank that wrote reports it
            writes = [(time.perf_counter(), "")]
        sizes = [os.path.getsize(p) for _, p in writes if p and os.path.isfile(p)]
        files = [p for _, p in writes if p]
        details: dict[str, Any] = {"framework": "lightning", "files": files}
        self.run.checkpoint_saved(
            step, blocking_s=max(0.0, writes[-1][0] - began), bytes=max(sizes) if sizes else None, details=details
        )

    def _loss(self, outputs: Any) -> float | None:
        """The step's loss, read at most once per heartbeat interval (reading a device tensor syncs)."""
        now = time.monotonic()
        if now - self._loss_read_at < LOSS_READ_INTERVAL_S:
            return None
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        item = getattr(loss, "item", None)
        if not callable(item):
            return None
        self._loss_read_at = now
        try:
            return float(item())
        except (TypeError, ValueError, RuntimeError):
            return None

    def _tokens(self, batch: Any) -> float | None:
        if callable(self.tokens_per_step):
            return float(self.tokens_per_step(batch))
        if self.tokens_per_step is not None:
            return float(self.tokens_per_step)
        try:
            return float(extract_batch_size(batch))
        except Exception:
            return None


class StepLog(Callback):
    """Zero-code progress: prints `[ftplane] global_step=N total=T` on every rank as training starts,
    then at most once per `interval_s` and at its end. Added by ftplane's entry point for the
    `lightning` progress preset; add it by hand to get the same lines without the preset."""

    def __init__(self, interval_s: float = STEP_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._printed_at = 0.0
        self._total: int | None = None

    def _print(self, trainer: pl.Trainer) -> None:
        total = f" total={self._total}" if self._total else ""
        print(f"[ftplane] global_step={trainer.global_step}{total}", flush=True)
        self._printed_at = time.monotonic()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._total = total_steps(trainer)
        self._print(trainer)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        if time.monotonic() - self._printed_at >= self.interval_s:
            self._print(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print(trainer)


def progress_callbacks() -> list[Callback]:
    """Lightning's entry point (`lightning.pytorch.callbacks_factory`): StepLog when the job's progress preset
    is `lightning`, else nothing (ftplane installed changes no other Trainer)."""
    return [StepLog()] if os.environ.get(Env.PROGRESS_PRESET) == PRESET else []
