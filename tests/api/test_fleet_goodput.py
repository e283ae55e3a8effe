"""`GET /v1/goodput` over the API (SQLite and PostgreSQL): jobs posted as trainers post them, summarized by the duty,
each team's figures equal to its jobs' own `GET /v1/jobs/{id}/goodput`; bad windows, buckets, groupings and
selectors are 422 naming the field and change nothing; a project's admins see their projects' jobs only; prices."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import row_counts

NOW = datetime.now(UTC).replace(microsecond=0)
T0 = NOW - timedelta(hours=3, minutes=17)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def history(crash: bool) -> list[dict[str, Any]]:
    """A job that trains, saves, (crashes and restarts in the job,) and succeeds: about 1.5 hours."""
    run = {"restart_count": 0, "iteration": 0, "start_step": 0}
    events = [
        {"key": "sub", "type": "submitted", "ts": at(0)},
        {"key": "run0", "type": "running", "ts": at(90), "rank": 0, "step": 0, "details": run},
        {
            "key": "ck",
            "type": "checkpoint_saved",
            "ts": at(2000),
            "step": 100,
            "details": {"step": 100, "blocking_s": 20},
        },
    ]
    if crash:
        events += [
            {
                "key": "rf",
                "type": "rank_failed",
                "ts": at(3000),
                "rank": 1,
                "step": 150,
                "details": {"cause_class": "crash"},
            },
            {"key": "ij", "type": "injob_restart", "ts": at(3060), "details": {"restart_count": 1, "failed_step": 150}},
            {
                "key": "run1",
                "type": "running",
                "ts": at(3200),
                "rank": 0,
                "step": 100,
                "details": {"restart_count": 1, "iteration": 0, "start_step": 100},
            },
        ]
    events.append({"key": "end", "type": "succeeded", "ts": at(5400), "details": {"final_step": 300}})
    return events


def launched_job(admin: TestClient, make_job: Callable[..., dict[str, Any]], **spec: Any) -> dict[str, Any]:
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job(**spec)
    with session_scope() as session:  # as the launch would
        row = models.jobs.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)
    return job


def post(admin: TestClient, job: dict[str, Any], events: list[dict[str, Any]]) -> None:
    trainer = {"Authorization": f"Bearer {job['token']}"}
    response = admin.post(f"/v1/jobs/{job['id']}/events", json={"events": events}, headers=trainer)
    assert response.status_code == 200, response.text


def summarize() -> None:
    from api.core.db import session_scope
    from workers.supervision import summarize_goodput

    with session_scope() as session:
        summarize_goodput.run_once(session)


@pytest.fixture
def two_teams(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> dict[str, dict[str, Any]]:
    jobs = {
        "a": launched_job(admin, make_job, name="a", labels={"team": "a"}, procs_per_node=2, nodes=2),
        "b": launched_job(admin, make_job, name="b", labels={"team": "b"}, procs_per_node=3),
    }
    post(admin, jobs["a"], history(crash=True))
    post(admin, jobs["b"], history(crash=False))
    summarize()
    return jobs


def test_each_team_equals_its_jobs_own_goodput(admin: TestClient, two_teams: dict[str, dict[str, Any]]) -> None:
    params = {"since": at(-600), "until": at(7200), "group_by": "label:team", "bucket": "1h"}
    body = admin.get("/v1/goodput", params=params).json()
    groups = {g["key"]: g for g in body["groups"]}
    assert set(groups) == {"a", "b"}
    for team, gpus in (("a", 4), ("b", 3)):
        own = admin.get(f"/v1/jobs/{two_teams[team]['id']}/goodput").json()
        group = groups[team]
        assert group["jobs"] == 1 and group["wall_hours"] == pytest.approx(own["wall_s"] / 3600)
        assert group["wall_gpu_hours"] == pytest.approx(own["wall_s"] * gpus / 3600)
        assert group["productive_gpu_hours"] == pytest.approx(own["productive_s"] * gpus / 3600)
        assert group["lost_gpu_hours"] == pytest.approx({k: v * gpus / 3600 for k, v in own["lost_s"].items()})
        assert group["faults_total"] == own["failures"]
        # Every second of [since, until): the last hour counts even when the window ends a second past it.
        hours = {(T0 + timedelta(seconds=t)).replace(minute=0, second=0) for t in range(-600, 7200)}
        assert len(group["series"]) == len(hours)  # 1 h buckets on the hour, the first and last clipped
        assert sum(b["wall_gpu_hours"] for b in group["series"]) == pytest.approx(group["wall_gpu_hours"])
    assert groups["a"]["faults"] == {"crash": 1} and groups["a"]["mtbf_hours"] == pytest.approx(1.5)
    assert groups["b"]["faults"] == {} and groups["b"]["mtbf_hours"] is None
    assert body["total"]["jobs"] == 2 and body["top_jobs"][0]["job_id"] == two_teams["a"]["id"]
    assert body["total"]["cost"] is None  # no price set


def test_a_window_clips_the_jobs(admin: TestClient, two_teams: dict[str, dict[str, Any]]) -> None:
    """An hour in the middle of both: each counts that hour only, all of it wall time."""
    body = admin.get("/v1/goodput", params={"since": at(1000), "until": at(4600), "group_by": "label:team"}).json()
    assert {g["key"]: g["wall_hours"] for g in body["groups"]} == pytest.approx({"a": 1.0, "b": 1.0})
    filtered = admin.get("/v1/goodput", params={"since": at(1000), "until": at(4600), "label": "team=b"}).json()
    assert filtered["total"]["jobs"] == 1 and filtered["total"]["wall_hours"] == pytest.approx(1.0)
    assert filtered["groups"] == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": at(100), "until": at(0)}, "since"),
        ({"since": at(0), "window": "1d"}, "window"),
        ({"window": "7d", "bucket": "1m"}, "bucket"),
        ({"bucket": "5x"}, "bucket"),
        ({"bucket": "0h"}, "bucket"),
        ({"window": "7"}, "window"),
        ({"since": "yesterday"}, "since"),
        ({"since": "2026-01-01T00:00:00"}, "since"),  # no time zone
        ({"group_by": "team"}, "group_by"),
        ({"group_by": "label:"}, "group_by"),
        ({"label": "team"}, "label"),
        ({"status": "DONE"}, "status"),
        ({"top": "101"}, "top"),
        ({"project": "Not_A_Project"}, "project"),
    ],
)
def test_bad_queries_are_422_naming_the_field(admin: TestClient, params: dict[str, str], field: str) -> None:
    before = row_counts()
    response = admin.get("/v1/goodput", params=params)
    assert response.status_code == 422, response.text
    named = [f["field"] for f in response.json()["error"]["fields"]]
    assert named and named[0].split("[")[0] == field, named
    assert row_counts() == before


def test_a_project_admin_sees_their_projects_jobs_only(
    admin: TestClient, client: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    for name in ("p-one", "p-two"):
        assert admin.post("/v1/projects", json={"name": name}).status_code == 201
    mine = launched_job(admin, make_job, name="mine", project="p-one")
    theirs = launched_job(admin, make_job, name="theirs", project="p-two")
    post(admin, mine, history(crash=False))
    post(admin, theirs, history(crash=True))
    summarize()
    token = admin.post("/v1/tokens", json={"name": "p1-admin", "project": "p-one", "role": "admin"}).json()["token"]
    viewer = admin.post("/v1/tokens", json={"name": "p1-viewer", "project": "p-one", "role": "viewer"}).json()["token"]
    as_admin = {"Authorization": f"Bearer {token}"}
    body = client.get("/v1/goodput", params={"group_by": "project"}, headers=as_admin).json()
    assert [g["key"] for g in body["groups"]] == ["p-one"] and theirs["id"] not in str(body)
    assert client.get("/v1/goodput", params={"project": "p-two"}, headers=as_admin).status_code == 404
    refused = client.get("/v1/goodput", headers={"Authorization": f"Bearer {viewer}"})
    assert refused.status_code == 403 and "the admin role" in refused.json()["error"]["message"]
    everyone = admin.get("/v1/goodput", params={"group_by": "project"}).json()
    assert {g["key"] for g in everyone["groups"]} >= {"p-one", "p-two"}


def test_prices_per_label_value(
    admin: TestClient, two_teams: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_GPU_HOUR_PRICE", "team=a:3.0,*:0.5")
    get_settings.cache_clear()
    body = admin.get("/v1/goodput", params={"since": at(-600), "until": at(7200), "group_by": "label:team"}).json()
    groups = {g["key"]: g for g in body["groups"]}
    for team, price in (("a", 3.0), ("b", 0.5)):
        cost = groups[team]["cost"]
        assert cost["wall"] == pytest.approx(groups[team]["wall_gpu_hours"] * price)
        assert cost["lost"]["restart"] == pytest.approx(groups[team]["lost_gpu_hours"]["restart"] * price)
        assert cost["unpriced_gpu_hours"] == 0
    monkeypatch.setenv("FTPLANE_GPU_HOUR_PRICE", "team=a:3.0")
    get_settings.cache_clear()
    body = admin.get("/v1/goodput", params={"since": at(-600), "until": at(7200)}).json()
    assert body["total"]["cost"]["unpriced_gpu_hours"] == pytest.approx(5400 * 3 / 3600)  # team b's, unlisted
    assert body["total"]["cost"]["wall"] == pytest.approx(5400 * 4 / 3600 * 3.0)


@pytest.mark.parametrize(
    "text", ["-1", "abc", "team=a:1,zone=b:2", "team=a:1,team=a:2", "team=a", "*:1,*:2", "team=a:nan", "inf"]
)
def test_a_wrong_price_stops_the_start_naming_the_setting(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from api.core.config import Settings

    monkeypatch.setenv("FTPLANE_GPU_HOUR_PRICE", text)
    with pytest.raises(ValidationError, match="FTPLANE_GPU_HOUR_PRICE"):
        Settings()
