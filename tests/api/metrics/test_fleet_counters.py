"""`/metrics`: the fleet's lost and productive GPU-seconds as counters, by cause and label value, as the summarizer
counted them; they only rise."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.metrics.test_metrics import scrape
from tests.api.test_fleet_goodput import history, launched_job, post, summarize


def test_lost_gpu_seconds_by_cause_and_team(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    crashy = launched_job(admin, make_job, name="crashy", labels={"team": "a"}, procs_per_node=2)
    post(admin, crashy, history(crash=True))
    calm = launched_job(admin, make_job, name="calm", procs_per_node=3, labels={})  # no team label
    post(admin, calm, history(crash=False))
    summarize()
    samples = scrape(admin)
    own = admin.get(f"/v1/jobs/{crashy['id']}/goodput").json()

    def lost(cause: str, team: str) -> float:
        return samples[
            ("ftplane_lost_gpu_seconds_total", (("cause", cause), ("label_key", "team"), ("label_value", team)))
        ]

    assert lost("restart", "a") == pytest.approx(own["lost_s"]["restart"] * 2)
    assert lost("recompute", "a") == pytest.approx(own["lost_s"]["recompute"] * 2)
    assert lost("straggler", "a") == 0  # every cause of a label value, zeros included
    productive = samples[("ftplane_productive_gpu_seconds_total", (("label_key", "team"), ("label_value", "a")))]
    assert productive == pytest.approx(own["productive_s"] * 2)
    assert lost("initialization", "") == pytest.approx(90 * 3)  # the job without the label
    assert (
        "ftplane_lost_gpu_seconds_total",
        (("cause", "restart"), ("label_key", "team"), ("label_value", "b")),
    ) not in samples
