"""NVRx on a GPU: the async checkpoint writer (the trainer's async engine on CUDA: `Checkpointer` with
`trainer/nvrx/async_checkpoint.py`'s `NvrxAsyncSaver`) and ft_launcher's rank monitor hearing the ranks'
NVRx heartbeats.

Marked `cuda` and skipped without a GPU (CI has none). `bash bench/gpu_setup.sh` runs them on a GPU
machine with NVRx 0.7, the version the CUDA path expects (pyproject's `gpu` extra):

- save -> finalize -> load, twice (the second save reuses the writer and its cached plan), each restored
  tensor-equal to the state at the save while training went on during the write;
- the background warm-up, then the first save: nothing written by the warm-up, and the save holds the
  values at the save, not those the warm-up staged;
- a save abandoned mid-write (what the trainer does after a fault) is never completed, the writer stops
  in bounded time, and a new saver in the same process (an in-process restart) resumes from the
  previous checkpoint and saves again;
- the real trainer killed (SIGKILL) right after scheduling a save: on resume that torn checkpoint is
  skipped and deleted, and training resumes from the one before;
- the real trainer under the node agent and ft_launcher, one GPU rank that hangs: the rank monitor says
  it got heartbeats ("Did not get subsequent heartbeat", not "initial"), and the agent reports the
  in-job restart as a hang from that line, and each launcher cycle from NVRx's timed lines and its
  cycle records.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
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
    is_complete,
    latest_complete,
    list_checkpoints,
    step_dir,
)
from ftplane.trainer.config import MODEL_PRESETS
from ftplane.trainer.model import Transformer, synthetic_batch
from tests.trainer.conftest import REPO, Job, Receiver, free_port, launcher_command, trainer_env

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (NVRx's async writer is the CUDA path); bash bench/gpu_setup.sh runs these",
    ),
]

# ft_launcher, where pip put its script or else through its module (an install with --target has no script
# on PATH).
LAUNCHER = (
    [shutil.which("ft_launcher")]
    if shutil.which("ft_launcher")
    else [
        sys.executable,
        "-c",
        "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())",
    ]
)


# The rank monitor's line when a rank's heartbeats stop, in NVRx 0.4.1's form and in 0.7.0's (seen on
# one H200): "[RankMonServer<pid>@<host>:<rank>] Did not get ..." and "[workload:?(<local rank>) infra:?(?)]
# rank_monitor_server.py:<line> [Cycle <n>] Did not get ...".
MONITOR_SAID = re.compile(
    r"(?:\[RankMonServer\d+@[^\]:]*:(\d+)\]"
    r"|\[workload:[^\]]*?\((\d+)\)[^\]]*\] rank_monitor_server\.py:\d+ \[Cycle \d+\])"
    r" Did not get (initial|subsequent) heartbeat\. Waited ([\d.]+) seconds"
)


class Events:
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, type: str, **kwargs: Any) -> str:
        self.events.append((type, kwargs))
        return "k"

    def saved(self) -> list[dict[str, Any]]:
        return [kw["details"] for t, kw in self.events if t == "checkpoint_saved"]


@pytest.fixture(scope="module")
def device() -> Iterator[torch.device]:
    """A one-rank group on GPU 0, as the trainer makes it (NCCL for CUDA tensors, gloo for the CPU)."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("cpu:gloo,cuda:nccl", store=store, rank=0, world_size=1, device_id=device)
    yield device
    dist.destroy_process_group()


def build(device: torch.device, preset: str, seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    with device:
        model = Transformer(MODEL_PRESETS[preset])
    mesh = init_device_mesh(device.type, (1,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, preset: str, steps: range) -> None:
    device = next(model.parameters()).device
    for step in steps:
        inputs, targets = synthetic_batch(
            MODEL_PRESETS[preset], batch_size=2, seed=1, step=step, dp_rank=0, device=device
        )
        loss = torch.nn.functional.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    out = {f"p.{k}": v.full_tensor().clone() for k, v in model.state_dict().items()}
    for i, state in enumerate(optimizer.state.values()):
        for k, v in state.items():
            out[f"o.{i}.{k}"] = v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
    return out


def assert_equal(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    assert any(k.startswith("o.") and k.endswith("exp_avg_sq") for k in expected)  # the optimizer's state too
    different = [k for k in expected if not torch.equal(actual[k], expected[k])]
    assert not different, f"{len(different)} of {len(expected)} tensors differ, e.g. {different[:3]}"


def restored(root: Path, device: torch.device, preset: str, step: int) -> dict[str, torch.Tensor]:
    """The newest complete checkpoint, loaded into a freshly initialised model (other weights) by the
    trainer's own loader; it must be the one of `step`."""
    model, optimizer = build(device, preset, seed=1)
    loader = Checkpointer(root, engine="sync", interval=1, keep=10, rank=0, reporter=Events(), device=device)  # type: ignore[arg-type]
    assert loader.load_latest(model, optimizer) == step
    loader.close()
    return snapshot(model, optimizer)


def nvrx_checkpointer(root: Path, events: Events, device: torch.device, keep: int = 10) -> Checkpointer:
    return Checkpointer(root, engine="async", interval=1, keep=keep, rank=0, reporter=events, device=device)  # type: ignore[arg-type]


def test_save_finalize_load_round_trip_is_tensor_equal(device: torch.device, tmp_path: Path) -> None:
    events = Events()
    model, optimizer = build(device, "small")
    ckpt = nvrx_checkpointer(tmp_path, events, device)
    train(model, optimizer, "small", range(2))
    for step in (2, 4):  # the second save goes to the same writer process, with the plan it cached
        ckpt.save(step, model, optimizer)
        saved = snapshot(model, optimizer)
        train(model, optimizer, "small", range(step, step + 2))  # training goes on during the write
        assert snapshot(model, optimizer)["p.output.weight"].ne(saved["p.output.weight"]).any()
        ckpt.wait()  # finalize: DCP's metadata, then the trainer's completion marker
        assert is_complete(step_dir(tmp_path, step))
        assert_equal(restored(tmp_path, device, "small", step), saved)
    ckpt.close()

    details = events.saved()
    assert [d["step"] for d in details] == [2, 4]
    for d in details:
        assert d["engine"] == "async" and 0 < d["blocking_s"] <= d["total_s"] and d["bytes"] > 50_000_000
        assert set(d["blocking_stages_s"]) == {"plan", "stage"}  # only NVRx's writer reports these
    marker = json.loads((step_dir(tmp_path, 4) / COMPLETE_MARKER).read_text())
    assert marker["step"] == 4 and marker["engine"] == "async" and marker["bytes"] == details[1]["bytes"]


def test_warm_up_then_the_first_save(
    device: torch.device, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

    events = Events()
    model, optimizer = build(device, "small")
    ckpt = nvrx_checkpointer(tmp_path, events, device)
    train(model, optimizer, "small", range(1))  # the optimizer's state exists from here on
    ckpt.warm_up(model, optimizer)
    assert list_checkpoints(tmp_path) == []  # the warm-up plans into a scratch directory, writes nothing
    # Whether NVRx's planning side still remembers the warm-up's plan when the first save comes: if it
    # does, the first save sends no tensors to the writer (recorded, not asserted: NVRx's internals).
    cached = len(getattr(FileSystemWriterAsync, "_cached_identifiers", ()))
    record_property("plans_cached_after_warm_up", cached)
    print("plans NVRx's planning side remembers after the warm-up:", cached)

    train(model, optimizer, "small", range(1, 3))  # the values change after the warm-up staged them
    ckpt.save(3, model, optimizer)
    saved = snapshot(model, optimizer)
    train(model, optimizer, "small", range(3, 4))
    ckpt.wait()
    ckpt.close()
    assert [c.step for c in list_checkpoints(tmp_path)] == [3] and is_complete(step_dir(tmp_path, 3))
    assert_equal(restored(tmp_path, device, "small", 3), saved)
    [first] = events.saved()
    record_property("first_save_after_warm_up", json.dumps({k: first[k] for k in ("blocking_s", "total_s")}))
    print("first save after the warm-up:", first["blocking_s"], "s blocked, stages", first["blocking_stages_s"])


def test_abandoned_save_is_never_completed_and_the_next_saver_resumes(
    device: torch.device, tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    preset = "medium"  # 134.9M parameters: 1.6 GB of state, a write that is still going when abandoned
    events = Events()
    model, optimizer = build(device, preset)
    ckpt = nvrx_checkpointer(tmp_path, events, device)
    train(model, optimizer, preset, range(1))
    ckpt.save(1, model, optimizer)
    ckpt.wait()
    saved_1 = snapshot(model, optimizer)

    train(model, optimizer, preset, range(1, 2))
    ckpt.save(2, model, optimizer)
    data_files = list(step_dir(tmp_path, 2).glob("*.distcp"))
    started = time.monotonic()
    ckpt.abandon()  # a fault: the save in flight is given up
    abandon_s = time.monotonic() - started
    print(f"abandoned the step-2 save {abandon_s:.2f} s after it was scheduled ({len(data_files)} data files then)")
    assert abandon_s < 60  # NVRx's writer is stopped (SIGTERM, then SIGKILL after its 30 s)
    time.sleep(2)  # nothing finishes it later either
    torn = step_dir(tmp_path, 2)
    assert not (torn / COMPLETE_MARKER).exists() and not (torn / ".metadata").exists()
    assert [d["step"] for d in events.saved()] == [1]
    # A write result the stopped writer may have queued before it ended (NVRx keeps one results queue per
    # process; the next save's finalize reads from it). Recorded, not asserted: NVRx's internals.
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    make_queue = getattr(filesystem_async, "get_write_results_queue", None)
    queued = make_queue().qsize() if make_queue else "n/a"
    record_property("write_results_queued_after_abandon", queued)
    print("write results left in NVRx's results queue after the abandon:", queued)
    del model, optimizer
    torch.cuda.empty_cache()

    # An in-process restart: the training function is entered again in this process with a new
    # Checkpointer (a new writer process); it resumes from step 1 and deletes the torn step 2.
    events = Events()
    model, optimizer = build(device, preset, seed=1)
    again = nvrx_checkpointer(tmp_path, events, device)
    assert again.load_latest(model, optimizer) == 1
    assert not torn.exists()
    assert_equal(snapshot(model, optimizer), saved_1)
    train(model, optimizer, preset, range(1, 2))
    again.save(2, model, optimizer)
    saved_2 = snapshot(model, optimizer)
    again.wait()
    again.close()
    assert [d["step"] for d in events.saved()] == [2] and is_complete(step_dir(tmp_path, 2))
    assert_equal(restored(tmp_path, device, preset, 2), saved_2)


def pythonpath() -> str:
    """The repository first, then whatever PYTHONPATH brought (on the GPU machine: the installed wheels)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def run_trainer(args: list[str], env: dict[str, str], log: Path, timeout: float = 180) -> int:
    """`python -m ftplane.trainer` standalone (one rank) in a process group of its own, killed with whatever it
    left behind (its writer and results-queue processes) once it has ended."""
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "ftplane.trainer", *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):  # none left
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_a_save_torn_by_a_crash_is_skipped_on_resume(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    metrics = tmp_path / "metrics.jsonl"
    args = ["--model", "small", "--steps", "12", "--log-every", "1", "--checkpoint-engine", "async"]
    args += ["--checkpoint-interval", "5", "--metrics-file", str(metrics)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FTPLANE_", "MASTER_", "TORCHELASTIC_"))}
    # The checkpoint dir from the environment, as a backend gives it: fired faults are recorded there too.
    env.update({"PYTHONPATH": pythonpath(), "PYTHONUNBUFFERED": "1", "FTPLANE_CHECKPOINT_DIR": str(ckpt)})
    env["FTPLANE_JOB_ID"] = f"torn-{tmp_path.name}"
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)

    # The step-10 save is scheduled, then the process kills itself (SIGKILL) before the next step: the
    # save of step 5 was complete (a save waits for the one before), that of step 10 can never be.
    crash = json.dumps([{"kind": "crash", "rank": 0, "at_step": 10}])
    rc = run_trainer(args, {**env, "FTPLANE_FAULTS": crash}, tmp_path / "first.log")
    first_log = (tmp_path / "first.log").read_text(errors="replace")
    assert rc == -signal.SIGKILL, first_log[-3000:]
    assert [(c.step, c.complete) for c in list_checkpoints(ckpt)] == [(5, True), (10, False)], first_log[-3000:]

    rc = run_trainer(args, {**env, "FTPLANE_FAULTS": "[]"}, tmp_path / "second.log")
    second_log = (tmp_path / "second.log").read_text(errors="replace")
    assert rc == 0, second_log[-3000:]
    assert re.search(r"skipping incomplete checkpoint \S*step-00000010", second_log), second_log[-3000:]
    assert re.search(r"resumed from \S*step-00000005 \(step 5\)", second_log), second_log[-3000:]
    # One metrics row per step, written after the step's save and fault: the first run's last is step 9.
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert steps == [*range(1, 10), *range(6, 13)], steps
    final = latest_complete(ckpt)
    assert final is not None and final.step == 12
    assert is_complete(step_dir(ckpt, 10))  # saved again, whole, by the resumed run


def test_nvrx_heartbeats_reach_the_rank_monitor(receiver: Receiver, launch: Callable[..., Job], tmp_path: Path) -> None:
    # 15 s: above the stall of the first save when it comes seconds after the writer's warm-up (it waits
    # for the warm-up: ~5 s on one H200, enough for a 5 s timeout to kill a healthy rank).
    heartbeat_timeout, initial_timeout = 15.0, 600.0
    env = trainer_env(
        receiver,
        tmp_path / "ckpt",
        extra={
            "PYTHONPATH": pythonpath(),
            "FTPLANE_CHECKPOINT_ENGINE": "async",
            "FTPLANE_FAULTS": json.dumps([{"kind": "hang", "rank": 0, "at_step": 8}]),
        },
    )
    trainer_args = ["--model", "small", "--steps", "15", "--log-every", "1", "--step-delay-s", "0.2"]
    command = launcher_command(
        trainer_args,
        nproc=1,
        max_restarts=1,
        initial_heartbeat_timeout=initial_timeout,
        heartbeat_timeout=heartbeat_timeout,
    )
    job = launch([*LAUNCHER, *command[1:]], env)
    assert job.wait(420) == 0, job.tail()

    # The rank monitor (in ft_launcher) tells the two cases apart: with no heartbeat ever it waits for
    # the initial timeout (600 s) and says "initial"; "subsequent" means the rank's heartbeats reached it.
    said = [(a or b, kind, waited) for a, b, kind, waited in MONITOR_SAID.findall(job.log())]
    assert said == [("0", "subsequent", f"{heartbeat_timeout:.2f}")], job.tail()

    [fault] = receiver.of_type("fault_injected")
    assert (fault["rank"], fault["step"], fault["details"]["kind"]) == (0, 8, "hang")
    restarted = [e for e in receiver.of_type("running") if e["details"]["restart_count"] == 1]
    assert restarted, receiver.types()
    detected_after = restarted[0]["received"] - fault["received"]
    print(f"hang at step 8 -> restarted rank running after {detected_after:.1f} s")
    # detection, then NVRx 0.7's launcher waits up to 50 s for the GPU's memory to be freed, then a new rank
    assert heartbeat_timeout - 0.5 <= detected_after < initial_timeout / 3, detected_after
    final = latest_complete(tmp_path / "ckpt")
    assert final is not None and final.step == 15

    [restart] = receiver.of_type("injob_restart")  # the agent, from the launcher's own line (0.4.1 and 0.6+ forms)
    details = restart["details"]
    assert details["cause_class"] == "hang" and details["silent_s"] == heartbeat_timeout, details

    # NVRx 0.7's own account of each launcher cycle: its timed phases (profiling lines) and its cycle records
    cycles = receiver.of_type("launcher_cycle")
    print("launcher cycles:", json.dumps([e["details"] for e in cycles]))
    timed = {e["details"]["cycle"]: e["details"]["phases"] for e in cycles if e["details"]["source"] == "launcher"}
    assert sorted(timed) == [0, 1] and {"rendezvous", "worker_start"} <= timed[1].keys(), cycles
    recorded = {
        (e["details"]["cycle"], "ended_at" in e["details"]) for e in cycles if e["details"]["source"] != "launcher"
    }
    assert {(0, False), (0, True), (1, False)} <= recorded, cycles
