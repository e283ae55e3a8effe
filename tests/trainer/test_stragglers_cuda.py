"""NVRx's straggler detection through the SDK's helper (trainer/sdk/stragglers.py), on a GPU: two ranks (gloo, both
on device 0) run the same CUDA work in a section each step, in lockstep; rank 1's section also takes 20 ms more of
its own. NVRx's report reaches each rank's run as `perf_score`: rank 1's below NVRx's own 0.75, rank 0's near 1.

Marked `cuda` and skipped without a GPU. On a GPU machine with NVRx 0.7 (the CUDA path's version):
`bash bench/gpu_setup.sh` installs it; then
`python3 -m pytest --confcutdir=tests/trainer tests/trainer/test_stragglers_cuda.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import REPO, free_port

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NVRx's detector profiles kernels)"),
]

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from ftplane.trainer.sdk.environment import Environment
    from ftplane.trainer.sdk.run import Run
    from ftplane.trainer.sdk.stragglers import StragglerDetection

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    run = Run(Environment.read({"RANK": str(rank), "WORLD_SIZE": "2"}), nvrx_heartbeats=False)
    detection = StragglerDetection(run, cuda=True, report_interval_s=2.0)
    x = torch.randn(2048, 2048, device="cuda")
    scores, started, n = [], time.monotonic(), 0
    while time.monotonic() - started < float(sys.argv[2]):
        with detection.section("work"):
            y = x @ x
            torch.cuda.synchronize()
            if rank == 1:
                time.sleep(0.02)  # this rank's own work takes longer
        dist.barrier()  # lockstep, as the collectives of a data-parallel step would make it
        n += 1
        run.step(n)
        scores.append(run.perf_score)
    flag = torch.tensor([1.0])
    dist.all_reduce(flag)  # both ranks are done before either shuts its detector down
    active = detection.active
    detection.close()
    with open(sys.argv[1], "w") as out:
        json.dump({"rank": rank, "active": active, "steps": n, "scores": scores}, out)
    dist.destroy_process_group()
    """
)


def test_nvrx_scores_a_rank_with_more_own_work_lower(tmp_path: Path) -> None:
    port = free_port()
    procs = []
    for rank in range(2):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        out = tmp_path / f"rank{rank}.json"
        procs.append((subprocess.Popen([sys.executable, "-c", WORKER, str(out), "12"], env=env, cwd=REPO), out))
    for proc, _ in procs:
        assert proc.wait(timeout=180) == 0
    results = {r["rank"]: r for r in (json.loads(out.read_text()) for _, out in procs)}
    assert results[0]["active"] and results[1]["active"], "NVRx's detector did not start"
    last = {rank: next(s for s in reversed(r["scores"]) if s is not None) for rank, r in results.items()}
    print("steps", {rank: r["steps"] for rank, r in results.items()}, "last perf_score", last)
    assert last[1] < 0.75 <= last[0]
