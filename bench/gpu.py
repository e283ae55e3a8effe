"""The trainer on a real GPU, in one invocation: `python3 -m bench.gpu --out DIR [--sections ...]`.

Sections (each in a process of its own, with a time limit; results go to DIR/results.json, every
log line to DIR/gpu.log):

- `env`: nvidia-smi, Python, torch and NVRx versions.
- `blocking`: the `large` model (~1.3B parameters, FSDP2 over one rank, AdamW state on the GPU), a few
  training steps, then the trainer's own `Checkpointer` saving with each engine: `sync` (dcp.save),
  `nvrx` (NVRx's async writer, the trainer's async engine on CUDA; warmed up in the background by
  `Checkpointer.warm_up` first, as the trainer does after its first step) and `dcp` (dcp.async_save, the
  trainer's async engine on CPU, forced here). The figure is the time the training step is blocked;
  target: async blocking <= 1/30 of sync.
- `efficiency`: `python -m ftplane.trainer --model large` with `--checkpoint-engine none`, then the same with
  `async`, one checkpoint every `--interval-s` of training (or `--interval-steps`); target: async
  wall-clock steps/s >= 99.5 % of none's over the same window of whole intervals (steps skip..skip +
  intervals x interval, each holding one save; every step's wall time counted, the checkpoint's
  blocking part included).
- `recovery`: ft_launcher (1 proc) with an exception fault at step 30: in-process restart
  (FTPLANE_INPROCESS=1) and in-job restart (ft_launcher restarts the worker); the figure is the time
  from the last good step before the fault to the first good step after it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SCRATCH = Path(os.environ.get("BENCH_GPU_SCRATCH", "/tmp/ftplane-gpu"))
LARGE_PARAMS_NOTE = "large: dim 2048, 24 layers, vocab 32000, seq 2048, batch 8"


def log(out: Path, text: str) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {text}"
    print(line, flush=True)
    with open(out / "gpu.log", "a") as f:
        f.write(line + "\n")


def save_result(out: Path, key: str, value: Any) -> None:
    path = out / "results.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    path.write_text(json.dumps(data, indent=2))


def run_logged(
    out: Path, cmd: list[str], env: dict[str, str] | None, timeout: float, logfile: str = "gpu.log"
) -> tuple[int, str]:
    """Run a command, its output appended to gpu.log; returns (rc, output). rc 124 on timeout."""
    log(out, "$ " + " ".join(cmd))
    started = time.monotonic()
    try:
        proc = subprocess.run(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
        )
        rc, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        raw = exc.stdout or b""
        rc, text = 124, raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    with open(out / logfile, "a") as f:
        f.write(text)
        if text and not text.endswith("\n"):
            f.write("\n")
    log(out, f"rc {rc} after {time.monotonic() - started:.1f} s")
    return rc, text


# --- env ----------------------------------------------------------------------------------------------


def section_env(out: Path) -> None:
    info: dict[str, Any] = {}
    for name, cmd in {
        "nvidia_smi": ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
        "uname": ["uname", "-a"],
        "df_tmp": ["df", "-h", "/tmp"],
        "nproc": ["nproc"],
    }.items():
        try:
            info[name] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception as exc:  # noqa: BLE001
            info[name] = f"failed: {exc}"
    import importlib.metadata as md

    import torch

    info["python"] = sys.version
    info["torch"] = torch.__version__
    info["cuda"] = torch.version.cuda
    info["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for pkg in ("nvidia-resiliency-ext", "grpcio", "protobuf", "numpy", "httpx"):
        try:
            info[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            info[pkg] = None
    log(out, "env: " + json.dumps(info))
    save_result(out, "env", info)


# --- blocking -----------------------------------------------------------------------------------------


class _Events:
    """Stands in for the trainer's Reporter: keeps the checkpoint events."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def event(self, type_: str, **kw: Any) -> None:
        self.events.append({"type": type_, **kw})


def section_blocking(out: Path, saves: int, dcp_saves: int, engines_wanted: list[str]) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ftplane.trainer.checkpoint import Checkpointer
    from ftplane.trainer.config import MODEL_PRESETS
    from ftplane.trainer.model import Transformer, count_parameters, synthetic_batch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    torch.cuda.set_device(0)
    device = torch.device("cuda", 0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1, device_id=device)
    args = MODEL_PRESETS["large"]
    torch.manual_seed(0)
    with device:
        model = Transformer(args)
    n_params = count_parameters(model)
    mesh = init_device_mesh("cuda", (1,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)

    def step(i: int) -> float:
        started = time.perf_counter()
        inputs, targets = synthetic_batch(args, batch_size=8, seed=0, step=i, dp_rank=0, device=device)
        loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - started

    step_times = [step(i) for i in range(4)]
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3  # params + exp_avg(_sq)
    log(out, f"large: {n_params / 1e6:.1f}M params, ~{state_bytes / 1e9:.1f} GB state; steps {step_times}")
    result: dict[str, Any] = {"params": n_params, "state_gb": round(state_bytes / 1e9, 2), "step_s": step_times}

    # (engine label, Checkpointer engine, the device that picks the async writer)
    engines = [
        ("sync", "sync", device, saves),
        ("nvrx_async", "async", device, saves),
        ("dcp_async_save", "async", torch.device("cpu"), dcp_saves),
    ]
    for label, engine, picker, n_saves in [e for e in engines if e[0] in engines_wanted]:
        root = SCRATCH / f"blocking-{label}"
        shutil.rmtree(root, ignore_errors=True)
        events = _Events()
        ckpt = Checkpointer(
            root,
            engine=engine,
            interval=1,
            keep=1,
            rank=0,
            reporter=events,  # type: ignore[arg-type]
            device=picker,
        )
        wall_blocked = []
        try:
            t0 = time.perf_counter()
            ckpt.warm_up(model, optimizer)  # a no-op but for the NVRx writer
            warm_stall = time.perf_counter() - t0
            ckpt.wait()  # the warm-up runs in the background; let it finish before the first save
            if label == "nvrx_async":
                warm_s = time.perf_counter() - t0
                log(out, f"{label} warm-up: stalled {warm_stall:.3f} s, done in the background in {warm_s:.1f} s")
                result[f"{label}_warm_up"] = {"stall_s": round(warm_stall, 4), "background_s": round(warm_s, 2)}
            for i in range(1, n_saves + 1):
                step(100 + i)  # the state changes between saves, as in training
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                ckpt.save(i, model, optimizer)
                wall_blocked.append(time.perf_counter() - t0)
                # the training step right after the save: slowed by the background write?
                after = step(200 + i)
                ckpt.wait()
                log(out, f"{label} save {i}: blocked {wall_blocked[-1]:.3f} s, next step {after:.3f} s")
            ckpt.close()
            saved = [e["details"] for e in events.events if e["type"] == "checkpoint_saved"]
            result[label] = {
                "blocking_s": [d["blocking_s"] for d in saved],
                "total_s": [d["total_s"] for d in saved],
                "wall_blocked_s": [round(x, 4) for x in wall_blocked],
                "bytes": [d["bytes"] for d in saved],
                "stages_s": [d.get("blocking_stages_s") for d in saved],
            }
        except Exception as exc:  # noqa: BLE001
            import traceback

            log(out, f"{label} FAILED: {traceback.format_exc()}")
            result[label] = {"error": f"{type(exc).__name__}: {exc}", "wall_blocked_s": wall_blocked}
        shutil.rmtree(root, ignore_errors=True)
        save_result(out, "blocking", result)

    # Medians over every save, the first included (the NVRx writer was warmed up beforehand, as
    # in the trainer); and the worst save of each engine.
    def figures(label: str) -> tuple[float | None, float | None]:
        xs = result.get(label, {}).get("blocking_s") or []
        return (statistics.median(xs), max(xs)) if xs else (None, None)

    summary: dict[str, Any] = {}
    sync, sync_worst = figures("sync")
    for label in ("nvrx_async", "dcp_async_save"):
        a, worst = figures(label)
        summary[label] = {
            "blocking_s": a,
            "worst_blocking_s": worst,
            "sync_over_async": (sync / a) if sync and a else None,
            "meets_1_30": bool(sync and a and a <= sync / 30),
            "worst_meets_1_30": bool(sync and worst and worst <= sync / 30),
        }
    summary["sync_blocking_s"] = sync
    result["summary"] = summary
    save_result(out, "blocking", result)
    log(out, "blocking summary: " + json.dumps(summary))
    dist.destroy_process_group()


# --- efficiency ---------------------------------------------------------------------------------------


def _trainer_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FTPLANE_")}
    for k in ("MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _window(rows: list[dict[str, Any]], first: int, last: int) -> float | None:
    """Wall time per step from the metrics row of step `first` to that of step `last`."""
    t = {r["step"]: r["t"] for r in rows}
    return (t[last] - t[first]) / (last - first) if first in t and last in t else None


def section_efficiency(
    out: Path, model: str, target_interval_s: float, interval_steps: int, skip: int, probe_steps: int, intervals: int
) -> None:
    result: dict[str, Any] = {"model": LARGE_PARAMS_NOTE if model == "large" else model}
    base = [sys.executable, "-m", "ftplane.trainer", "--model", model, "--log-every", "50"]
    if not interval_steps:
        # A short run without checkpoints: its step time sets the interval.
        probe = SCRATCH / "metrics-probe.jsonl"
        probe.unlink(missing_ok=True)
        rc, _ = run_logged(
            out,
            [*base, "--steps", str(probe_steps), "--checkpoint-engine", "none", "--metrics-file", str(probe)],
            _trainer_env(),
            timeout=240,
        )
        step_s = _window(_metrics(probe), skip, probe_steps)
        if rc != 0 or step_s is None:
            result["error"] = f"probe run rc {rc}"
            save_result(out, "efficiency", result)
            return
        interval_steps = max(20, math.ceil(target_interval_s / step_s))
        result["probe_wall_step_s"] = step_s
    # The window: steps skip..skip + intervals x interval, with saves at interval, 2 x interval, ...
    # (all inside it, since skip < interval); the final save after the loop is outside it.
    last = skip + intervals * interval_steps
    steps = last + 1
    result.update({"interval_steps": interval_steps, "steps": steps, "window": [skip, last]})
    log(out, f"efficiency: interval {interval_steps} steps, {steps} steps, window steps {skip}..{last}")

    runs: dict[str, Any] = {}
    for engine in ("none", "async"):
        metrics = SCRATCH / f"metrics-{engine}.jsonl"
        metrics.unlink(missing_ok=True)
        ckdir = SCRATCH / "eff-ckpt"
        shutil.rmtree(ckdir, ignore_errors=True)
        cmd = [*base, "--steps", str(steps), "--checkpoint-engine", engine, "--metrics-file", str(metrics)]
        if engine != "none":
            cmd += ["--checkpoint-dir", str(ckdir), "--checkpoint-interval", str(interval_steps)]
            cmd += ["--checkpoint-keep", "1"]
        rc, text = run_logged(out, cmd, _trainer_env(), timeout=420)
        rows = _metrics(metrics)
        shutil.copy(metrics, out / metrics.name) if metrics.exists() else None
        keep = ("checkpoint step", "warming up", "deleted")
        run: dict[str, Any] = {"rc": rc, "steps_done": len(rows)}
        run["checkpoint_lines"] = [line for line in text.splitlines() if any(k in line for k in keep)]
        wall = _window(rows, skip, last)
        if wall is not None:
            in_window = [r["step_s"] for r in rows if skip < r["step"] <= last]
            run.update(
                {
                    "wall_step_s": wall,
                    "steps_per_s": 1 / wall,
                    "interval_s": wall * interval_steps,
                    "median_step_s": statistics.median(in_window),
                    "slowest_wall_steps_s": sorted(
                        (round(b["t"] - a["t"], 3) for a, b in itertools.pairwise(rows) if skip < b["step"] <= last),
                        reverse=True,
                    )[:3],
                }
            )
        runs[engine] = run
        shutil.rmtree(ckdir, ignore_errors=True)
        save_result(out, "efficiency", {**result, "runs": runs})
    if "steps_per_s" in runs.get("none", {}) and "steps_per_s" in runs.get("async", {}):
        ratio = runs["async"]["steps_per_s"] / runs["none"]["steps_per_s"]
        result["async_over_none"] = ratio
        result["meets_99_5"] = ratio >= 0.995
        log(out, f"efficiency: async/none steps/s = {ratio:.4f}")
    save_result(out, "efficiency", {**result, "runs": runs})


# --- recovery -----------------------------------------------------------------------------------------


def _launcher() -> list[str]:
    exe = shutil.which("ft_launcher")
    if exe:
        return [exe]
    return [
        sys.executable,
        "-c",
        "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())",
    ]


def section_recovery(out: Path, model: str, fault_step: int) -> None:
    result: dict[str, Any] = {"model": model, "fault_step": fault_step}
    for rung, inprocess in (("inprocess", "1"), ("injob", "0")):
        work = SCRATCH / f"recovery-{rung}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        metrics = work / "metrics.jsonl"
        env = _trainer_env(
            {
                "FTPLANE_INPROCESS": inprocess,
                "FTPLANE_FAULTS": json.dumps([{"kind": "exception", "rank": 0, "at_step": fault_step}]),
                "FTPLANE_JOB_ID": f"gpu-{rung}",
            }
        )
        cmd = [
            *_launcher(),
            "--nnodes=1",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:29650",
            f"--rdzv-id=gpu-{rung}",
            "--max-restarts=2",
            "--ft-initial-rank-heartbeat-timeout=120",
            "--ft-rank-heartbeat-timeout=60",
            "--ft-restart-policy=any-failed",
            "--monitor-interval=1",
            "--no-python",
            sys.executable,
            "-m",
            "trainer",
            "--model",
            model,
            "--steps",
            str(fault_step + 30),
            "--log-every",
            "10",
            "--checkpoint-engine",
            "async",
            "--checkpoint-interval",
            "10",
            "--checkpoint-dir",
            str(work / "ckpt"),
            "--metrics-file",
            str(metrics),
        ]
        rc, text = run_logged(out, cmd, env, timeout=130)
        rows = _metrics(metrics)
        r: dict[str, Any] = {"rc": rc, "rows": len(rows)}
        # The restart is where the step count goes back (the resumed run redoes steps from its checkpoint);
        # the row before it is the last good step before the fault, wherever the trainer fires the fault
        # relative to writing a step's row.
        resume = next((i for i in range(1, len(rows)) if rows[i]["step"] <= rows[i - 1]["step"]), None)
        restarted = rows[resume:] if resume is not None else []
        if resume is not None:
            last, first = rows[resume - 1], rows[resume]
            r.update(
                {
                    "last_good_step": last["step"],
                    "resumed_at_step": first["step"],
                    "fault_to_first_good_step_s": round(first["t"] - last["t"], 3),
                    "first_step_s_after": first["step_s"],
                    "steps_redone": last["step"] - (first["step"] - 1),
                }
            )
        r["restarted_rows"] = len(restarted)
        r["restart_lines"] = [
            line for line in text.splitlines() if "resumed from" in line or "restart" in line.lower()
        ][:20]
        result[rung] = r
        log(out, f"recovery {rung}: {json.dumps({k: v for k, v in r.items() if k != 'restart_lines'})}")
        save_result(out, "recovery", result)


# --- main ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-gpu-out"))
    parser.add_argument("--sections", default="env,blocking,efficiency,recovery")
    parser.add_argument("--section", help=argparse.SUPPRESS)  # internal: run one section in this process
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--dcp-saves", type=int, default=2, help="dcp.async_save's saves (each writes slowly)")
    parser.add_argument("--engines", default="sync,nvrx_async,dcp_async_save", help="the blocking section's engines")
    parser.add_argument("--interval-s", type=float, default=150.0)
    parser.add_argument("--interval-steps", type=int, default=0, help="instead of --interval-s (skips the probe)")
    parser.add_argument("--intervals", type=int, default=1, help="whole checkpoint intervals in the window")
    parser.add_argument("--skip", type=int, default=10)
    parser.add_argument("--probe-steps", type=int, default=40)
    parser.add_argument("--recovery-model", default="medium")
    parser.add_argument("--eff-model", default="large")
    parser.add_argument("--fault-step", type=int, default=30)
    parser.add_argument("--budget-s", type=float, default=570.0, help="stop starting sections after this")
    a = parser.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    SCRATCH.mkdir(parents=True, exist_ok=True)

    if a.section:
        {
            "env": lambda: section_env(out),
            "blocking": lambda: section_blocking(out, a.saves, a.dcp_saves, a.engines.split(",")),
            "efficiency": lambda: section_efficiency(
                out, a.eff_model, a.interval_s, a.interval_steps, a.skip, a.probe_steps, a.intervals
            ),
            "recovery": lambda: section_recovery(out, a.recovery_model, a.fault_step),
        }[a.section]()
        return

    started = time.monotonic()
    limits = {"env": 60, "blocking": 420, "efficiency": 540, "recovery": 300}
    for section in a.sections.split(","):
        left = a.budget_s - (time.monotonic() - started)
        if left < 30:
            log(out, f"skipping {section}: {left:.0f} s left")
            save_result(out, f"{section}_skipped", f"{left:.0f} s left of the budget")
            continue
        cmd = [sys.executable, "-m", "bench.gpu", "--out", str(out), "--section", section]
        cmd += ["--saves", str(a.saves), "--dcp-saves", str(a.dcp_saves), "--skip", str(a.skip)]
        cmd += ["--interval-s", str(a.interval_s), "--interval-steps", str(a.interval_steps)]
        cmd += ["--intervals", str(a.intervals), "--engines", a.engines]
        cmd += ["--probe-steps", str(a.probe_steps), "--recovery-model", a.recovery_model]
        cmd += ["--fault-step", str(a.fault_step), "--eff-model", a.eff_model]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        rc, text = run_logged(out, cmd, env, timeout=min(limits[section], left), logfile="sections.log")
        print(text[-3000:], flush=True)
        if rc != 0:
            save_result(out, f"{section}_rc", rc)
    path = out / "results.json"
    print(path.read_text() if path.exists() else "no results", flush=True)


if __name__ == "__main__":
    main()
