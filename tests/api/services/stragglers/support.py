"""Driving straggler detection by hand: a running job on a scripted backend, heartbeats at chosen times (in the
past, so the ingest takes them as sent), and passes of the duties at those times."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from api.schemas.events import utcnow
from tests.support.supervision import supervise

PER_NODE = 4


def node_of(rank: int) -> str:
    return f"node-{rank // PER_NODE}"


def running_job(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], *, started: datetime | None = None, **spec: Any
) -> str:
    """A job whose attempt 0 runs (the scripted backend says so, and its ranks said `running`, at `started`)."""
    job = make_job(**spec)
    supervise(job["id"], force_launch=True)
    ranks = spec.get("nodes", 1) * spec.get("procs_per_node", 2)
    when = {"ts": started.isoformat()} if started is not None else {}
    events = [
        {"key": f"run-{r}", "type": "running", "rank": r, "details": {"start_step": 0}, **when} for r in range(ranks)
    ]
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": events}).status_code == 200
    supervise()
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    return str(job["id"])


def beat(
    admin: TestClient,
    job_id: str,
    at: datetime,
    paces: Mapping[int, float],
    *,
    step: int = 10,
    signal: str = "compute_s",
    step_time_s: float | None = 1.0,
) -> None:
    """Each rank's heartbeat at `at`: `paces[rank]` seconds of `signal` per step."""
    beats = []
    for rank, pace in paces.items():
        beat: dict[str, Any] = {"rank": rank, "step": step, "ts": at.isoformat(), "node": node_of(rank), signal: pace}
        if signal != "step_time_s" and step_time_s is not None:
            beat["step_time_s"] = step_time_s
        beats.append(beat)
    response = admin.post(f"/v1/jobs/{job_id}/heartbeats", json={"heartbeats": beats})
    assert response.status_code == 200, response.text


def run_pass(now: datetime) -> None:
    from api.core.db import session_scope
    from workers.supervision import detect_stragglers

    with session_scope() as session:
        detect_stragglers.run_once(session, now)


def events_of(admin: TestClient, job_id: str, type_: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/events", params={"type": type_, "limit": 1000}).json()["items"])


def past(hours: float = 2.0) -> datetime:
    """A start time in the past: heartbeats dated from there are taken as sent (none is ahead of the server)."""
    return utcnow() - timedelta(hours=hours)
