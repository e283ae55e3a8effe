"""Submitting, listing, describing and cancelling jobs over REST."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.spec import JobSpec
from tests.conftest import row_counts, tiny_spec


def test_submit_returns_job_and_trainer_token_once(admin: TestClient) -> None:
    response = admin.post("/v1/jobs", json=tiny_spec())
    assert response.status_code == 201
    job = response.json()
    assert job["status"] == "PENDING"
    assert job["token"].startswith("ftp_job_")
    assert job["spec"]["resiliency"]["max_in_job_restarts"] == 3  # defaults are filled in
    again = admin.get(f"/v1/jobs/{job['id']}").json()
    assert "token" not in again
    assert again["attempts"][0]["number"] == 0


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"nmae": "typo"}, "nmae"),
        ({"name": "Not_A_DNS_Label"}, "name"),
        ({"procs_per_node": 0}, "procs_per_node"),
        ({"nodes": -3}, "nodes"),
        ({"checkpoint": {"engine": "turbo"}}, "checkpoint.engine"),
        ({"resiliency": {"max_job_restarts": 10**9}}, "resiliency.max_job_restarts"),
        ({"resiliency": {"inprocess": {"enabled": True, "surprise": 1}}}, "resiliency.inprocess.surprise"),
        ({"faults": [{"kind": "meteor", "rank": 0, "at_step": 1}]}, "faults[0].kind"),
        ({"labels": {"team": "x" * 70}}, "labels.team"),
        ({"command": []}, "command"),
        ({"progress": {"preset": "keras"}}, "progress.preset"),
    ],
)
def test_invalid_spec_is_refused_naming_the_field_and_stores_nothing(
    admin: TestClient, patch: dict[str, Any], field: str
) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=tiny_spec(**patch))
    assert response.status_code == 422
    fields = [f["field"] for f in response.json()["error"]["fields"]]
    assert field in fields, fields
    assert field in response.json()["error"]["message"]
    assert row_counts() == before


@pytest.mark.parametrize(
    ("patch", "words"),
    [
        ({"backend": "kubernetes"}, "image is required"),
        ({"faults": [{"kind": "crash", "rank": 5, "at_step": 3}]}, "faults[0].rank"),
        ({"env": {"FTPLANE_TOKEN": "x"}}, "env.FTPLANE_TOKEN"),
        ({"nodes": 9}, "nodes must be at most 8 for the local backend"),
        ({"working_dir": "relative/dir"}, "working_dir must be an absolute path"),
        ({"working_dir": "/nonexistent/ftplane-job"}, "working_dir /nonexistent/ftplane-job is not a directory"),
        ({"progress": {"log_pattern": r"step (?P<step>\d+)", "preset": "lightning"}}, "not both"),
    ],
)
def test_inconsistent_spec_says_what_is_wrong(admin: TestClient, patch: dict[str, Any], words: str) -> None:
    before = row_counts()
    response = admin.post("/v1/jobs", json=tiny_spec(**patch))
    assert response.status_code == 422
    assert words in response.json()["error"]["message"]
    assert row_counts() == before


def test_every_example_spec_is_valid_and_a_relative_working_dir_is_the_submitters() -> None:
    from ftplane.cli import load_spec
    from tests.support.paths import REPO

    examples = sorted((REPO / "examples").rglob("*.yaml"))
    assert len(examples) >= 10
    for path in examples:
        spec = JobSpec.model_validate(load_spec(path))
        if spec.backend == "local" and spec.working_dir is not None:
            assert spec.working_dir == str(Path.cwd().resolve()), path  # `.`, as the CLI runs in


def test_list_filters_by_status_and_label_with_cursor_pagination(admin: TestClient, make_job: Any) -> None:
    ids = [make_job(name=f"job-{i}", labels={"team": "a" if i % 2 else "b"})["id"] for i in range(7)]
    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"limit": 2, "label": "team=a"}
        if cursor:
            params["cursor"] = cursor
        body = admin.get("/v1/jobs", params=params).json()
        pages.append([j["id"] for j in body["items"]])
        cursor = body["next_cursor"]
        if not cursor:
            break
    seen = [i for page in pages for i in page]
    assert seen == [ids[i] for i in (5, 3, 1)]  # newest first, only team=a
    assert all(len(p) <= 2 for p in pages)
    assert admin.get("/v1/jobs", params={"status": "RUNNING"}).json()["items"] == []
    assert len(admin.get("/v1/jobs", params={"status": "PENDING"}).json()["items"]) == 7


def test_bad_filters_are_422(admin: TestClient) -> None:
    assert admin.get("/v1/jobs", params={"status": "NAPPING"}).status_code == 422
    bad_label = admin.get("/v1/jobs", params={"label": "novalue"})
    assert bad_label.status_code == 422 and bad_label.json()["error"]["fields"][0]["field"] == "label"
    assert admin.get("/v1/jobs", params={"cursor": "garbage!!"}).status_code == 422


def test_unknown_job_is_404(admin: TestClient) -> None:
    response = admin.get("/v1/jobs/nope")
    assert response.status_code == 404
    assert "nope" in response.json()["error"]["message"]


def test_cancel_pending_job_is_immediate_and_idempotent(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    first = admin.post(f"/v1/jobs/{job['id']}/cancel")
    assert first.status_code == 202 and first.json()["status"] == "CANCELLED"
    assert admin.post(f"/v1/jobs/{job['id']}/cancel").json()["status"] == "CANCELLED"
    events = admin.get(f"/v1/jobs/{job['id']}/events").json()["items"]
    assert [e["type"] for e in events] == ["cancelled"]


def test_body_size_is_bounded(admin: TestClient) -> None:
    huge = tiny_spec(env={"BIG": "x" * 8000, **{f"V{i}": "y" * 8000 for i in range(1200)}})
    response = admin.post("/v1/jobs", json=huge)
    assert response.status_code == 413
    assert "bytes" in response.json()["error"]["message"]


def test_openapi_docs_are_served(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/jobs", "/v1/jobs/{job_id}/events", "/v1/jobs/{job_id}/heartbeats", "/v1/jobs/{job_id}/ranks"):
        assert path in paths


def test_heartbeat_timeout_must_outlast_inprocess_restarts(admin: TestClient) -> None:
    bad = {"inprocess": {"enabled": True, "soft_timeout_s": 60, "hard_timeout_s": 90}, "heartbeat_timeout_s": 30}
    response = admin.post("/v1/jobs", json=tiny_spec(resiliency=bad))
    assert response.status_code == 422
    assert "heartbeat_timeout_s must be greater than" in response.json()["error"]["message"]


def test_a_jobs_detail_shows_its_newest_events_however_many_it_has(admin: TestClient, make_job: Any) -> None:
    """A job of 131,072 ranks stores hundreds of thousands of events; its detail shows the 20 that happened last."""
    from sqlalchemy import insert

    from api.core.db import session_scope
    from api.database.tables import Event

    job = make_job()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    row = {"job_id": job["id"], "attempt": 0, "type": "checkpoint_saved", "received_at": start, "details": {}}
    rows = [{**row, "key": f"e{i}", "ts": start + timedelta(seconds=i), "step": i} for i in range(10_030)]
    rows.append({**row, "key": "late", "ts": start, "step": 0})  # stored last, happened first
    with session_scope() as session:
        session.execute(insert(Event), rows)
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert [e["key"] for e in detail["recent_events"]] == [f"e{i}" for i in range(10_010, 10_030)]
