"""ftplane's Hugging Face callback in a real `Trainer.train()` on the CPU, in this process (a GPT-2 built from a tiny
config, synthetic tokens), reporting to a fake node agent: an exception that ends the script is reported, a SIGTERM
mid-train saves the step it came at and ends `train()`, and the resumed run reports the checkpoint with its load
time."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.run import Run
from ftplane.trainer.sdk.transformers import FtplaneCallback
from tests.trainer.sdk.conftest import FakeAgent

SEQUENCE = 8


class Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, samples: int) -> None:
        self.tokens = torch.randint(0, 64, (samples, SEQUENCE), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[index], "labels": self.tokens[index]}


class Stepping(Trainer):  # type: ignore[misc]
    """A Trainer whose training step runs `at_step(global_step)` first."""

    def __init__(self, *args: Any, at_step: Callable[[int], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.at_step = at_step

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.at_step(self.state.global_step)
        return super().training_step(*args, **kwargs)  # type: ignore[no-any-return]


def trainer(tmp_path: Path, run: Run, steps: int, at_step: Callable[[int], None] = lambda step: None) -> Stepping:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=SEQUENCE, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=4,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callbacks = [FtplaneCallback(run=run)]
    return Stepping(model=model, args=args, train_dataset=Tokens(64), callbacks=callbacks, at_step=at_step)


@pytest.fixture
def sigterm_restored() -> Iterator[None]:
    """SIGTERM is harmless here whatever the code under test does, and the SDK's stop flag is cleared after."""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    yield
    signal.signal(signal.SIGTERM, previous)
    termination._requested.clear()
    termination._agreed.clear()
    termination._deadline.clear()


def test_an_exception_that_ends_the_script_is_reported(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer has no exception hook for callbacks: the SDK's own (sys.excepthook) reports what ends the script."""

    def fail(step: int) -> None:
        if step == 2:
            raise ValueError("the loss is NaN at step 2")

    run = make_run(agent)
    monkeypatch.setattr(sys, "excepthook", lambda *exc: None)  # what runs after the SDK's hook: quiet here
    run.report_uncaught_exceptions()
    with pytest.raises(ValueError, match="the loss is NaN") as raised:
        trainer(tmp_path, run, steps=6, at_step=fail).train()
    sys.excepthook(raised.type, raised.value, raised.tb)  # what the interpreter does with it at the script's end
    (failed,) = agent.wait_events(1, "rank_failed")
    assert failed["details"]["cause"] == "ValueError: the loss is NaN at step 2" and failed["step"] == 2
    assert failed["details"]["cause_class"] == "exception"


def test_sigterm_mid_train_saves_that_step_ends_train_and_the_resumed_run_says_its_load_time(
    make_run: Callable[..., Run], agent: FakeAgent, tmp_path: Path, sigterm_restored: None
) -> None:
    def stop(step: int) -> None:
        if step == 5:  # the 6th step is under way: it ends, is saved, and is the last
            os.kill(os.getpid(), signal.SIGTERM)

    run = make_run(agent)
    stopping = trainer(tmp_path, run, steps=20, at_step=stop)
    stopping.train()
    callback = next(c for c in stopping.callback_handler.callbacks if isinstance(c, FtplaneCallback))
    assert termination.agreed_stop() and callback.stopped_at == 6 and stopping.state.global_step == 6
    assert (tmp_path / "out" / "checkpoint-6" / "trainer_state.json").is_file()
    assert run.flush(5)
    assert [e["step"] for e in agent.wait_events(2, "checkpoint_saved")] == [4, 6]

    termination._requested.clear()
    termination._agreed.clear()
    resumed = trainer(tmp_path, run, steps=8)
    resumed.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-6"))
    assert resumed.state.global_step == 8
    (loaded,) = agent.wait_events(1, "checkpoint_loaded")
    assert loaded["step"] == 6 and loaded["details"]["path"].endswith("checkpoint-6")
    assert loaded["details"]["load_s"] > 0
