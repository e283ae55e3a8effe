"""Goodput of a real job: a real trainer under ft_launcher, crashed once, supervised by `ftplane serve`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ftplane.client import Client
from tests.conftest import ftplane_server
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def wait(what: str, condition: Callable[[], Any], timeout: float = 180) -> Any:
    return wait_for(what, condition, timeout, interval=0.3)


def test_real_job_buckets_sum_to_wall_and_ettr_is_a_fraction(tmp_path: Path) -> None:
    with ftplane_server(tmp_path) as env:
        api = Client(url=env["FTPLANE_URL"], token=env["FTPLANE_TOKEN"])
        spec = {
            "name": "goodput",
            "command": ["python", "-m", "ftplane.trainer", "--model", "tiny", "--batch-size", "4"]
            + ["--steps", "30", "--step-delay-s", "0.15"],
            "procs_per_node": 2,
            "env": {"OMP_NUM_THREADS": "1"},
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval_steps": 5, "engine": "async"},
            "resiliency": {"max_in_job_restarts": 2, "max_job_restarts": 1, "heartbeat_timeout_s": 10},
        }
        job_id = api.submit(spec)["id"]

        def step() -> int:
            return max((r["step"] for r in api.ranks(job_id)), default=0)

        wait("training past a checkpoint", lambda: step() >= 8)
        mid = api.request("GET", f"/v1/jobs/{job_id}/goodput")
        assert mid["finished"] is False and mid["wall_s"] > 0 and mid["productive_s"] > 0
        api.inject(job_id, {"kind": "crash", "rank": 1, "now": True})
        job = wait("the job to end", lambda: (j := api.job(job_id))["status"] in ("SUCCEEDED", "FAILED") and j, 240)
        assert job["status"] == "SUCCEEDED", job

        g = api.request("GET", f"/v1/jobs/{job_id}/goodput")
        api.close()

    assert g["finished"] is True
    assert g["productive_s"] + sum(g["lost_s"].values()) == pytest.approx(g["wall_s"], abs=1e-6)
    assert 0 < g["ettr"] <= 1
    assert sum(a["wall_s"] for a in g["attempts"]) == pytest.approx(g["wall_s"], abs=1e-6)
    assert g["failures"] >= 1
    assert g["lost_s"]["initialization"] > 0 and g["lost_s"]["restart"] > 0
    assert g["step_time_s"] and g["step_time_s"] > 0.1  # the 0.15 s delay per step, at least
    assert g["advice"]["checkpoint_blocking_s"] is not None and g["advice"]["current"]["interval_steps"] == 5
