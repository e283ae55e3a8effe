"""Bad input is refused naming the field (and stores nothing): a slowdown's fraction outside (0, 10], a duration
under one step, a rank outside the job, straggler thresholds and windows out of range; a good slowdown reaches
the rank with its fraction and duration."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.services.stragglers.support import running_job
from tests.conftest import row_counts, tiny_spec
from tests.support.supervision import ScriptedBackend

SLOWDOWN = {"kind": "slowdown", "rank": 1, "at_step": 5, "fraction": 0.5, "duration_steps": 20}


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"faults": [{**SLOWDOWN, "fraction": 0}]}, "faults[0].fraction"),
        ({"faults": [{**SLOWDOWN, "fraction": -0.5}]}, "faults[0].fraction"),
        ({"faults": [{**SLOWDOWN, "fraction": 10.5}]}, "faults[0].fraction"),
        ({"faults": [{**SLOWDOWN, "fraction": "half"}]}, "faults[0].fraction"),
        ({"faults": [{**SLOWDOWN, "duration_steps": 0}]}, "faults[0].duration_steps"),
        ({"faults": [{**SLOWDOWN, "duration_steps": 1.5}]}, "faults[0].duration_steps"),
        ({"resiliency": {"stragglers": {"threshold": 0}}}, "resiliency.stragglers.threshold"),
        ({"resiliency": {"stragglers": {"threshold": 1}}}, "resiliency.stragglers.threshold"),
        ({"resiliency": {"stragglers": {"threshold": 1.5}}}, "resiliency.stragglers.threshold"),
        ({"resiliency": {"stragglers": {"window_s": 0.5}}}, "resiliency.stragglers.window_s"),
        ({"resiliency": {"stragglers": {"window_s": 10**6}}}, "resiliency.stragglers.window_s"),
        ({"resiliency": {"stragglers": {"exclude_after_s": 0}}}, "resiliency.stragglers.exclude_after_s"),
        ({"resiliency": {"stragglers": {"action": "shoot"}}}, "resiliency.stragglers.action"),
        ({"resiliency": {"stragglers": {"windw_s": 60}}}, "resiliency.stragglers.windw_s"),
        ({"resiliency": {"anomalies": {"storm_restarts": 1}}}, "resiliency.anomalies.storm_restarts"),
        ({"resiliency": {"anomalies": {"storm_window_s": 1}}}, "resiliency.anomalies.storm_window_s"),
        ({"resiliency": {"anomalies": {"stalled_cycles": 0}}}, "resiliency.anomalies.stalled_cycles"),
        ({"resiliency": {"anomalies": {"cycle_timeout_s": -1}}}, "resiliency.anomalies.cycle_timeout_s"),
    ],
)
def test_bad_stragglers_and_slowdowns_in_a_spec_are_422_naming_the_field(
    admin: TestClient, patch: dict[str, Any], field: str
) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=tiny_spec(**patch))
    assert response.status_code == 422, response.text
    fields = [f["field"] for f in response.json()["error"]["fields"]]
    assert field in fields, fields
    assert row_counts() == before


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"faults": [{**SLOWDOWN, "rank": 2}]}, "faults[0].rank 2 is outside the job's 2 ranks"),
        ({"faults": [{k: v for k, v in SLOWDOWN.items() if k != "fraction"}]}, "a slowdown needs fraction"),
        ({"faults": [{k: v for k, v in SLOWDOWN.items() if k != "duration_steps"}]}, "needs duration_steps"),
        ({"faults": [{"kind": "crash", "rank": 0, "at_step": 3, "fraction": 0.5}]}, "for kind slowdown only"),
        ({"resiliency": {"stragglers": {"window_s": 2}}}, "resiliency.stragglers.window_s must be at least 3 s"),
        (
            {"resiliency": {"exclude_failed_nodes": False, "stragglers": {"action": "exclude"}}},
            "resiliency.stragglers.action exclude needs resiliency.exclude_failed_nodes",
        ),
    ],
)
def test_inconsistent_stragglers_and_slowdowns_say_what_is_wrong(
    admin: TestClient, patch: dict[str, Any], words: str
) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=tiny_spec(**patch))
    assert response.status_code == 422, response.text
    assert words in response.json()["error"]["message"]
    assert row_counts() == before


def test_a_window_fits_a_shorter_report_interval() -> None:
    from api.schemas.spec import JobSpec

    spec = JobSpec.model_validate(
        tiny_spec(progress={"report_interval_s": 0.2}, resiliency={"stragglers": {"window_s": 1}})
    )
    assert spec.resiliency.stragglers.window_s == 1 and spec.resiliency.stragglers.action == "alert"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SLOWDOWN, "fraction": 0}, "fraction"),
        ({**SLOWDOWN, "fraction": 10.01}, "fraction"),
        ({**SLOWDOWN, "fraction": True}, "fraction"),
        ({**SLOWDOWN, "duration_steps": 0}, "duration_steps"),
        ({**SLOWDOWN, "duration_steps": "5"}, "duration_steps"),
        ({**SLOWDOWN, "rank": 7}, "rank"),
    ],
)
def test_bad_slowdowns_injected_are_422_naming_the_field(
    admin: TestClient, make_job: Any, backend: ScriptedBackend, body: dict[str, Any], field: str
) -> None:
    job_id = running_job(admin, make_job)
    response = admin.post(f"/v1/jobs/{job_id}/faults", json=body)
    assert response.status_code == 422, response.text
    assert field in [f["field"] for f in response.json()["error"]["fields"]]
    assert field in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({k: v for k, v in SLOWDOWN.items() if k != "fraction"}, "a slowdown needs fraction"),
        ({k: v for k, v in SLOWDOWN.items() if k != "duration_steps"}, "a slowdown needs duration_steps"),
        ({"kind": "hang", "rank": 0, "now": True, "duration_steps": 3}, "for kind slowdown only"),
    ],
)
def test_incomplete_slowdowns_injected_say_what_is_missing(
    admin: TestClient, make_job: Any, backend: ScriptedBackend, body: dict[str, Any], words: str
) -> None:
    job_id = running_job(admin, make_job)
    response = admin.post(f"/v1/jobs/{job_id}/faults", json=body)
    assert response.status_code == 422 and words in response.json()["error"]["message"]


def test_a_slowdown_reaches_the_rank_with_its_fraction_and_duration(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job_id = running_job(admin, make_job)
    fault = admin.post(f"/v1/jobs/{job_id}/faults", json={**SLOWDOWN, "at_step": None, "now": True})
    assert fault.status_code == 202, fault.text
    out = fault.json()
    assert out["delivery"] == "trainer"  # the rank's own code sleeps, even "now"
    assert (out["fraction"], out["duration_steps"]) == (0.5, 20)
    reply = admin.post(f"/v1/jobs/{job_id}/heartbeats", json={"heartbeats": [{"rank": 1, "step": 3}]}).json()
    (directive,) = reply["faults"]
    assert directive["kind"] == "slowdown" and directive["rank"] == 1 and directive["at_step"] is None
    assert (directive["fraction"], directive["duration_steps"]) == (0.5, 20)
