"""ftplane's Lightning callback in a real `Trainer.fit` on the CPU, in this process (a small MLP, synthetic data),
reporting to a fake node agent: an exception that ends `fit` is reported, and a SIGTERM mid-fit saves the step it
came at through ModelCheckpoint and ends `fit`."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.lightning import FtplaneCallback
from ftplane.trainer.sdk.run import Run
from tests.trainer.sdk.conftest import FakeAgent


class Regression(pl.LightningModule):  # type: ignore[misc]
    """A linear map learnt from random data; `at_step(step)` runs inside the training step of that global step."""

    def __init__(self, at_step: Callable[[int], None] = lambda step: None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.at_step = at_step

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.at_step(self.trainer.global_step)
        inputs, targets = batch
        return torch.nn.functional.mse_loss(self.net(inputs), targets)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(64, 8, generator=generator), torch.randn(64, 1)), batch_size=4)


def fit(
    tmp_path: Path, run: Run, model: Regression, steps: int = 10, **checkpointing: Any
) -> tuple[pl.Trainer, FtplaneCallback]:
    callback = FtplaneCallback(run=run)
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, **{"every_n_train_steps": 4, **checkpointing})
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[saves, callback],
    )
    trainer.fit(model, data())
    return trainer, callback


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    """SIGTERM is harmless here whatever the code under test does (pytest must not die of it), and the SDK's
    stop flag is cleared after the test."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGTERM, previous)
    termination._requested.clear()
    termination._agreed.clear()
    termination._deadline.clear()


def test_an_exception_that_ends_fit_is_reported(make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path) -> None:
    def fail(step: int) -> None:
        if step == 3:
            raise ValueError("the loss is NaN at step 3")

    run = make_run(agent)
    with pytest.raises(ValueError, match="the loss is NaN"):
        fit(tmp_path, run, Regression(fail))
    (failed,) = agent.wait_events(1, "rank_failed")
    details = failed["details"]
    assert details["cause"] == "ValueError: the loss is NaN at step 3" and details["cause_class"] == "exception"
    assert details["exception_type"] == "ValueError" and failed["step"] == 3


def test_sigterm_mid_fit_saves_that_step_through_modelcheckpoint_and_ends_fit(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path, sigterm_restored: None
) -> None:
    def stop(step: int) -> None:
        if step == 6:  # the 7th step is under way: it ends, is saved, and is the last
            os.kill(os.getpid(), signal.SIGTERM)

    run = make_run(agent)
    trainer, callback = fit(tmp_path, run, Regression(stop), steps=20)
    assert termination.agreed_stop() and callback.stopped_at == 7 and trainer.global_step == 7
    last = tmp_path / "ckpt" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 7  # what fit(ckpt_path="last") resumes from
    assert run.flush(5)
    saved = agent.wait_events(2, "checkpoint_saved")
    assert [e["step"] for e in saved] == [4, 7] and saved[-1]["details"]["files"] == [str(last)]
    assert [e["details"]["cause"] for e in agent.events("rank_failed")] == []  # stopped, not failed


def test_a_stop_without_save_last_still_leaves_a_last_checkpoint(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path, sigterm_restored: None
) -> None:
    def stop(step: int) -> None:
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    run = make_run(agent)
    callback = FtplaneCallback(run=run)
    saves = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4)
    trainer = pl.Trainer(
        max_steps=20,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[saves, callback],
    )
    trainer.fit(Regression(stop), data())
    assert trainer.global_step == 2
    assert torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)["global_step"] == 2
