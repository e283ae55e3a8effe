"""ftplane for the Hugging Face `Trainer` (transformers): one callback, one line.

    from ftplane.sdk.transformers import FtplaneCallback

    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[FtplaneCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))

What it reports through the rank's run (trainer/sdk/run.py), with nothing timed by hand:

- `running` when training starts, at the global step it resumed from (the Trainer restored it), and
  the total (`state.max_steps`), so progress and ETA work; the checkpoint resumed from
  (`checkpoint_loaded`, rank 0, with the seconds the Trainer spent loading it: the callback times the
  Trainer's own loading methods, `_load_from_checkpoint`, `_load_optimizer_and_scheduler` and
  `_load_scaler`, of the Trainer it is given to at its construction);
- every optimizer step with throughput (`tokens_per_step`, default the samples of one optimizer step
  of this rank) and the loss the Trainer last logged (no device sync of its own);
- each checkpoint once it is written: from the end of the step (or of the evaluation the Trainer runs
  before saving) to `on_save`, with the bytes of the checkpoint's directory. The Trainer writes a
  checkpoint from every rank (each its RNG state) with no barrier after it, so on `on_save` the
  callback waits for all ranks (one `torch.distributed.barrier()` per checkpoint): the checkpoint is
  then complete everywhere before any rank reports it or a fault fires;
- evaluation and checkpoint saves as phases (trainer/sdk/phases.py): no hang while they run.

Stopping (an eviction, a drain, a cancel): from `on_train_begin` the callback holds SIGTERM for the rank
(trainer/sdk/termination.py). At the end of every optimizer step the ranks agree whether any of them was
told (`run.should_stop()`: one small all-reduce per step); if one was, `control.should_save` and
`should_training_stop` make the Trainer save that step's checkpoint and end `train()`, within the job's
`resiliency.stop_grace_s`. The script's code after `train()` then runs; `if sdk.termination.agreed_stop():
sdk.termination.end()` ends the rank as stopped, not finished. `stop_on_sigterm=False` leaves SIGTERM as it was.

A fault injected `at_step: N` fires in `on_step_begin` of step N+1, after the checkpoint of step N
(the Trainer saves after `on_step_end`, so a fault fired there would precede the save). An exception
that ends the script is reported as `rank_failed` by the SDK's exception hook.

Zero code: the job spec's `progress: {preset: transformers}` reads the Trainer's own progress bar and
log lines (trainer/agent/presets.py).
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.process_run import init
from ftplane.trainer.sdk.run import Run

log = logging.getLogger("ftplane.trainer.sdk")

CHECKPOINT_PREFIX = "checkpoint"  # the Trainer's PREFIX_CHECKPOINT_DIR: <output_dir>/checkpoint-<step>
# What the Trainer calls to load a checkpoint it resumes from, before `on_train_begin`.
LOAD_METHODS = ("_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_scaler")


def directory_bytes(path: Path) -> int | None:
    """The bytes of the files under `path` (None if it is not there)."""
    if not path.is_dir():
        return None
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def wait_for_all_ranks() -> None:
    """A barrier of the default process group, where there is one with more than one rank."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def calling_trainer(callback: TrainerCallback) -> Trainer | None:
    """The Trainer whose hook is running `callback` now (a hook's caller holds it as `self`), if any."""
    frame = inspect.currentframe()
    try:
        while frame is not None:
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, Trainer) and callback in candidate.callback_handler.callbacks:
                return candidate
            frame = frame.f_back
        return None
    finally:
        del frame  # no reference cycle through the frames


class FtplaneCallback(TrainerCallback):  # type: ignore[misc]  # transformers' classes are untyped
    """Reports a Hugging Face Trainer's training to ftplane (see the module's docstring). Every argument is
    optional:

    tokens_per_step  units per optimizer step of this rank, for throughput (default: its samples)
    run              the SDK run to report through (default: `ftplane.sdk.init()`'s)
    phase_timeout_s  how long an evaluation or a save may go without steps before it may be a hang
    stop_on_sigterm  on SIGTERM, save the step and end `train()` (default)
    """

    def __init__(
        self,
        *,
        tokens_per_step: float | None = None,
        run: Run | None = None,
        phase_timeout_s: float | None = None,
        stop_on_sigterm: bool = True,
    ) -> None:
        self.tokens_per_step = tokens_per_step
        self.phase_timeout_s = phase_timeout_s
        self.stop_on_sigterm = stop_on_sigterm
        self._run = run
        self._loss: float | None = None
        self._save_step: int | None = None  # the step whose checkpoint the Trainer is about to write
        self._save_began = 0.0
        self._load_s = 0.0  # the Trainer's loading of the checkpoint it resumes from
        self.stopped_at: int | None = None  # the step a SIGTERM ended `train()` at

    @property
    def run(self) -> Run:
        if self._run is None:
            self._run = init()
        return self._run

    def on_init_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        trainer = calling_trainer(self)
        if trainer is None:
            return
        for name in LOAD_METHODS:  # timed on this Trainer only; a version without one is timed without it
            method = getattr(trainer, name, None)
            if callable(method):
                setattr(trainer, name, self._timed(method))

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        run = self.run
        run.total_steps = state.max_steps or None
        if state.global_step and state.is_world_process_zero:
            path = str(self._checkpoint_dir(args, state.global_step))
            run.checkpoint_loaded(state.global_step, load_s=self._load_s or None, path=path)
        self._load_s = 0.0
        if self.stop_on_sigterm and threading.current_thread() is threading.main_thread():
            termination.install()
        run.start(state.global_step, {"framework": "transformers"})

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run.phases.end()
        self.run.before_step(state.global_step)  # the checkpoint of this step, if any, is written

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        tokens = self.tokens_per_step
        if tokens is None:
            tokens = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.run.step(state.global_step, loss=self._loss, tokens=tokens, inject=False)
        # every rank asks at the same step: all of them save and stop, if any was told to
        if self.stop_on_sigterm and self.stopped_at is None and self.run.should_stop():
            self.stopped_at = state.global_step
            control.should_save = control.should_training_stop = True
            log.warning(
                "rank %d: stopping at step %d (SIGTERM): saving, then ending train()", self.run.rank, self.stopped_at
            )
        # The Trainer's flow callback, which runs first, has decided what follows this step.
        if control.should_save:
            self._save_step, self._save_began = state.global_step, time.perf_counter()
        if control.should_evaluate:
            self.run.phases.begin("evaluation", self.phase_timeout_s)
        elif control.should_save:
            self.run.phases.begin("checkpoint", self.phase_timeout_s)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        loss = (logs or {}).get("loss")
        if isinstance(loss, int | float) and not isinstance(loss, bool):
            self._loss = float(loss)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._save_step == state.global_step:
            self._save_began = time.perf_counter()  # the save follows the evaluation
            self.run.phases.begin("checkpoint", self.phase_timeout_s)
        else:
            self.run.phases.end()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        began = self._save_began if self._save_step == state.global_step else None
        self._save_step = None
        wait_for_all_ranks()  # every rank's part of the checkpoint is written
        self.run.phases.end()
        if began is None or not state.is_world_process_zero:
            return
        path = self._checkpoint_dir(args, state.global_step)
        self.run.checkpoint_saved(
            state.global_step,
            blocking_s=time.perf_counter() - began,
            bytes=directory_bytes(path),
            details={"framework": "transformers", "path": str(path)},
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.run.phases.end()
        self.run.flush(2.0)

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._load_s += time.perf_counter() - started

        return timed

    @staticmethod
    def _checkpoint_dir(args: TrainingArguments, step: int) -> Path:
        return Path(os.fspath(args.output_dir or ".")) / f"{CHECKPOINT_PREFIX}-{step}"
