"""Checkpoint engines on a one-rank gloo group: what is complete, what is kept, and that a save/load
round trip restores model and optimizer exactly."""

from __future__ import annotations

import datetime
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ftplane.trainer.checkpoint import (
    COMPLETE_MARKER,
    Checkpointer,
    latest_complete,
    list_checkpoints,
    rotate,
    step_dir,
)
from ftplane.trainer.config import MODEL_PRESETS
from ftplane.trainer.model import Transformer, synthetic_batch
from tests.trainer.conftest import free_port


def fake_checkpoint(root: Path, step: int, *, marker: bool = True, metadata: bool = True) -> Path:
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"x" * 10)
    if metadata:
        (path / ".metadata").write_bytes(b"m")
    if marker:
        (path / COMPLETE_MARKER).write_text("{}")
    return path


def test_only_checkpoints_with_marker_and_metadata_are_complete(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 20, marker=False)  # a rank died mid-save
    fake_checkpoint(tmp_path, 30, metadata=False)  # never finished (cannot happen with our marker, still refused)
    (tmp_path / "step-notanumber").mkdir()
    (tmp_path / "step-00000040").write_text("a file, not a checkpoint")
    assert [(c.step, c.complete) for c in list_checkpoints(tmp_path)] == [(10, True), (20, False), (30, False)]
    latest = latest_complete(tmp_path)
    assert latest is not None and latest.step == 10
    assert latest_complete(tmp_path / "missing") is None


def test_rotation_keeps_the_newest_complete_and_in_progress_ones(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 25, marker=False)  # dead: older than the newest complete one
    fake_checkpoint(tmp_path, 50, marker=False)  # maybe still being written
    deleted = rotate(tmp_path, keep=2)
    assert sorted(p.name for p in deleted) == ["step-00000010", "step-00000020", "step-00000025"]
    assert [(c.step, c.complete) for c in list_checkpoints(tmp_path)] == [(30, True), (40, True), (50, False)]


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, type: str, **kwargs: Any) -> str:
        self.events.append((type, kwargs))
        return "k"


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Transformer(MODEL_PRESETS["tiny"])
    mesh = init_device_mesh("cpu", (1,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        inputs, targets = synthetic_batch(
            MODEL_PRESETS["tiny"], batch_size=2, seed=1, step=step, dp_rank=0, device=torch.device("cpu")
        )
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"p.{k}": v.full_tensor().clone() for k, v in model.state_dict().items()}
    for i, state in enumerate(optimizer.state.values()):
        for k, v in state.items():
            out[f"o.{i}.{k}"] = v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
    return out


@pytest.mark.usefixtures("one_rank_group")
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_save_then_load_restores_model_and_optimizer(tmp_path: Path, engine: str) -> None:
    events = Events()
    model, optimizer = build()
    ckpt = Checkpointer(
        tmp_path, engine=engine, interval=3, keep=1, rank=0, reporter=events, device=torch.device("cpu")
    )  # type: ignore[arg-type]
    train_steps(model, optimizer, range(3))
    assert ckpt.due(3) and not ckpt.due(4)
    ckpt.save(3, model, optimizer)
    saved = snapshot(model, optimizer)
    train_steps(model, optimizer, range(3, 5))  # training goes on while an async save is in flight
    ckpt.wait()
    assert snapshot(model, optimizer)["p.output.weight"].ne(saved["p.output.weight"]).any()

    marker = json.loads((step_dir(tmp_path, 3) / COMPLETE_MARKER).read_text())
    assert marker["step"] == 3 and marker["engine"] == engine and marker["bytes"] > 100_000
    [(kind, details)] = [(t, kw["details"]) for t, kw in events.events]
    assert kind == "checkpoint_saved" and details["step"] == 3 and details["engine"] == engine
    assert 0 <= details["blocking_s"] <= details["total_s"] and details["bytes"] == marker["bytes"]

    fresh_model, fresh_optimizer = build()
    loader = Checkpointer(
        tmp_path, engine=engine, interval=3, keep=1, rank=0, reporter=events, device=torch.device("cpu")
    )  # type: ignore[arg-type]
    assert loader.load_latest(fresh_model, fresh_optimizer) == 3
    restored = snapshot(fresh_model, fresh_optimizer)
    assert restored.keys() == saved.keys()
    assert all(torch.equal(restored[k], saved[k]) for k in saved)
    assert events.events[-1][0] == "checkpoint_loaded" and events.events[-1][1]["details"]["step"] == 3
    ckpt.close()


@pytest.mark.usefixtures("one_rank_group")
def test_torn_checkpoints_are_skipped_and_newer_ones_cleared(tmp_path: Path) -> None:
    events = Events()
    model, optimizer = build()
    ckpt = Checkpointer(
        tmp_path, engine="sync", interval=2, keep=3, rank=0, reporter=events, device=torch.device("cpu")
    )  # type: ignore[arg-type]
    ckpt.save(2, model, optimizer)
    torn = fake_checkpoint(tmp_path, 4, marker=False)
    assert ckpt.load_latest(*build()) == 2
    assert not torn.exists()  # it would otherwise be written into again at step 4


def test_engine_none_reads_and_writes_nothing(tmp_path: Path) -> None:
    fake_checkpoint(tmp_path, 10)
    ckpt = Checkpointer(
        tmp_path, engine="none", interval=1, keep=1, rank=0, reporter=Events(), device=torch.device("cpu")
    )  # type: ignore[arg-type]
    assert not ckpt.enabled and not ckpt.due(1)
    model = torch.nn.Linear(2, 2)
    assert ckpt.load_latest(model, torch.optim.SGD(model.parameters())) == 0


@pytest.mark.usefixtures("one_rank_group")
def test_old_checkpoints_are_deleted_off_the_training_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import ftplane.trainer.checkpoint as checkpoint_module

    deleting_threads: list[str] = []
    real_rotate = checkpoint_module.rotate

    def recording_rotate(root: Path, keep: int, owner: str | None = None) -> list[Path]:
        deleting_threads.append(threading.current_thread().name)
        return real_rotate(root, keep, owner)

    monkeypatch.setattr(checkpoint_module, "rotate", recording_rotate)
    events = Events()
    model, optimizer = build()
    ckpt = Checkpointer(
        tmp_path, engine="sync", interval=1, keep=2, rank=0, reporter=events, device=torch.device("cpu")
    )  # type: ignore[arg-type]
    for step in (1, 2, 3):
        ckpt.save(step, model, optimizer)
    ckpt.close()  # waits for the deletions
    assert [c.step for c in list_checkpoints(tmp_path)] == [2, 3]
    assert len(deleting_threads) == 3 and threading.current_thread().name not in deleting_threads
    # a sync save's blocking time is all of it: the step waited until the checkpoint was marked complete
    saved = [kw["details"] for t, kw in events.events if t == "checkpoint_saved"]
    assert [d["step"] for d in saved] == [1, 2, 3] and all(d["blocking_s"] == d["total_s"] > 0 for d in saved)


def test_the_tensors_of_a_nested_state_with_dtensors_as_their_local_shard() -> None:
    from ftplane.trainer.checkpoint import local_tensors

    state = {
        "model": {"w": torch.zeros(4, 8), "b": torch.zeros(3, dtype=torch.float16)},
        "optim": {
            "state": {"w": {"exp_avg": torch.zeros(2, 2), "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 1}],
        },
        "extra": [torch.zeros(5, dtype=torch.uint8), "text", None],
    }
    assert sorted(t.nbytes for t in local_tensors(state, "cpu")) == [4, 5, 6, 16, 128]
    assert local_tensors(state, "cuda") == []


@pytest.mark.usefixtures("one_rank_group")
def test_the_tensors_of_a_sharded_model_and_optimizer(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from ftplane.trainer.checkpoint import local_tensors

    model, optimizer = build()
    train_steps(model, optimizer, range(1))
    model_state, optim_state = get_state_dict(model, optimizer)
    tensors = local_tensors({"model": model_state, "optim": optim_state}, "cpu")
    assert not any(isinstance(t, torch.distributed.tensor.DTensor) for t in tensors)
    sizes = [t.nbytes for t in tensors]
    params = sum(p.to_local().nbytes for p in model.parameters())  # type: ignore[operator]
    # params, exp_avg and exp_avg_sq; AdamW's 4-byte `step` per parameter
    assert sum(sizes) == 3 * params + 4 * len(list(model.parameters()))


def checkpointer(root: Path, events: Events, job_id: str | None, **kw: Any) -> Checkpointer:
    return Checkpointer(
        root,
        engine="sync",
        interval=2,
        keep=1,
        rank=0,
        reporter=events,  # type: ignore[arg-type]
        device=torch.device("cpu"),
        job_id=job_id,
        environ={},
        **kw,
    )


@pytest.mark.usefixtures("one_rank_group")
def test_jobs_given_one_directory_neither_resume_from_nor_delete_each_others_checkpoints(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Finding 1: a job resumed from another job's newest checkpoint and deleted the other's in-progress and old
    ones. Each checkpoint names its job; a Checkpointer loads and deletes its own job's only."""
    model, optimizer = build()
    first = checkpointer(tmp_path, Events(), "job-a")
    for step in (2, 4):
        first.save(step, model, optimizer)
    first.close()
    in_progress = fake_checkpoint(tmp_path, 6, marker=False)
    (in_progress / "ftplane-owner.json").write_text(json.dumps({"job_id": "job-a", "step": 6}))

    torn = fake_checkpoint(tmp_path, 10, marker=False)  # job-b's own save, torn by a crash
    (torn / "ftplane-owner.json").write_text(json.dumps({"job_id": "job-b", "step": 10}))

    events = Events()
    second = checkpointer(tmp_path, events, "job-b")
    with caplog.at_level(logging.WARNING, logger="ftplane.trainer.checkpoint"):
        assert second.load_latest(*build()) == 0  # not job-a's step 4
    assert in_progress.exists() and not torn.exists()  # job-a's save in progress is left alone, its own torn one not
    assert "2 checkpoint(s) under" in caplog.text  # job-a's two, counted before job-b's torn one went
    with pytest.raises(RuntimeError, match="holds a checkpoint of job job-a"):
        second.save(4, model, optimizer)  # one step directory cannot hold both jobs' checkpoints
    for step in (2, 8):
        second.save(step, model, optimizer)
    second.close()  # waits for the rotation
    owners = {(c.step, c.owner) for c in list_checkpoints(tmp_path)}
    assert owners == {(4, "job-a"), (6, "job-a"), (8, "job-b")}  # each job kept its newest; job-a's untouched


@pytest.mark.usefixtures("one_rank_group")
def test_resume_from_loads_the_other_jobs_newest_checkpoint_read_only(tmp_path: Path) -> None:
    """`checkpoint.resume_from`: a new job starts from another job's newest complete checkpoint, writes its own
    into its own directory, deletes nothing of the other's, and once it has its own, resumes from those."""
    source, own = tmp_path / "job-a", tmp_path / "job-b"
    model, optimizer = build()
    first = checkpointer(source, Events(), "job-a")
    train_steps(model, optimizer, range(2))
    first.save(2, model, optimizer)
    first.close()
    saved = snapshot(model, optimizer)
    left = fake_checkpoint(source, 3, marker=False)  # a torn save of the source job

    events = Events()
    resumed = checkpointer(own, events, "job-b", resume_from=source)
    fresh_model, fresh_optimizer = build()
    assert resumed.load_latest(fresh_model, fresh_optimizer) == 2
    assert all(torch.equal(snapshot(fresh_model, fresh_optimizer)[k], saved[k]) for k in saved)
    (loaded,) = [kw["details"] for t, kw in events.events if t == "checkpoint_loaded"]
    assert loaded["from_job"] == "job-a" and loaded["step"] == 2
    assert left.exists() and [c.step for c in list_checkpoints(source)] == [2, 3]

    resumed.save(4, fresh_model, fresh_optimizer)
    resumed.close()
    assert [c.step for c in list_checkpoints(own)] == [4] and [c.step for c in list_checkpoints(source)] == [2, 3]
    again = checkpointer(own, Events(), "job-b", resume_from=source)
    assert again.load_latest(*build()) == 4  # its own, newer than the source's


def test_the_job_id_and_the_directory_to_resume_from_come_from_the_environment(tmp_path: Path) -> None:
    environ = {"FTPLANE_JOB_ID": "job-b", "FTPLANE_CHECKPOINT_RESUME_FROM": str(tmp_path / "job-a")}
    ckpt = Checkpointer(
        tmp_path / "job-b",
        engine="none",
        interval=1,
        keep=1,
        rank=0,
        reporter=Events(),
        device=torch.device("cpu"),
        environ=environ,
    )  # type: ignore[arg-type]
    assert (ckpt.job_id, ckpt.resume_from) == ("job-b", tmp_path / "job-a")
