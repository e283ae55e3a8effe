"""Where a straggler shows: the rank grid colours ranks by their score and outlines the straggler, the jobs list
carries a badge while the episode is open, the job page draws the rolling goodput, and /metrics has the gauges."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from fastapi.testclient import TestClient

from api.schemas.events import utcnow
from tests.api.metrics.test_metrics import scrape, value
from tests.api.services.stragglers.support import events_of, running_job
from tests.api.services.stragglers.test_detection import SPEC, drive
from tests.support.supervision import ScriptedBackend


def test_a_straggler_on_the_dashboard_and_in_metrics(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job, **SPEC)
    drive(admin, job_id, 40, {5: (0, 40, 1.6)}, start=utcnow() - timedelta(seconds=41))  # the ranks are fresh
    assert len(events_of(admin, job_id, "straggler_detected")) == 1

    rows = admin.get("/ui/jobs").text
    assert re.search(rf'data-job-id="{job_id}".*?badge-straggler', rows, re.S)

    page = admin.get(f"/ui/jobs/{job_id}/live").text
    cell = re.search(r'<div class="rank alive (\S*)" data-rank="5" data-score="([0-9.]+)"', page)
    assert cell is not None and cell.group(1) == "straggler", page[page.find('data-rank="5"') - 200 :][:400]
    others = re.findall(r'<div class="rank alive (\S*)" data-rank="(\d)"', page)
    assert {band for band, rank in others if rank != "5"} <= {"pace-ok", "pace-fair"}
    assert 'id="rolling-goodput"' in page and 'data-window="5 min"' in page and 'data-window="60 min"' in page

    samples = scrape(admin)
    name = {"job_id": job_id, "job": "tiny"}
    assert value(samples, "ftplane_job_stragglers", **name) == 1
    assert 0.5 < value(samples, "ftplane_job_straggler_score", **name) < 0.85
    assert value(samples, "ftplane_stragglers_detected_total") >= 1
    assert ("ftplane_job_goodput_rolling_ratio", tuple(sorted({**name, "window": "5m"}.items()))) in samples
    assert ("ftplane_anomalies_total", (("kind", "recovery_stuck"),)) in samples  # every kind's series, from the start
