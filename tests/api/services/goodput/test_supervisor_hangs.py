"""What the supervisor records of a hang, as goodput reads it: when the silence began (silent_s), and a
hang of more ranks than one event batch holds (the scale benchmark's job-wide hang of 16,384 nodes), stored over
several passes."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.events import MAX_EVENTS_PER_BATCH
from tests.support.supervision import ScriptedBackend, supervise, use_backend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


def hangs(admin: TestClient, job_id: str) -> list[dict[str, Any]]:
    items, cursor = [], "0"
    while cursor:
        page = admin.get(f"/v1/jobs/{job_id}/events", params={"type": "hang_detected", "limit": 1000, "cursor": cursor})
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
    return items


def test_a_hang_of_more_ranks_than_one_batch_is_recorded_with_its_silence(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.schemas.events import utcnow

    ranks = MAX_EVENTS_PER_BATCH + 500
    job = make_job(resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    last_seen = utcnow() - timedelta(seconds=12)
    beats = [{"rank": r, "step": 7, "ts": last_seen.isoformat()} for r in range(ranks)]
    assert admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats}).status_code == 200

    supervise(job["id"])
    assert len(hangs(admin, job["id"])) == MAX_EVENTS_PER_BATCH  # a pass stores one batch
    supervise(job["id"])  # and the next the rest: goodput reads both passes' as one failure

    found = hangs(admin, job["id"])
    assert len(found) == ranks
    silent = [h["details"]["silent_s"] for h in found]
    assert all(12 <= s < 20 for s in silent)  # since the last heartbeat, not since detection

    g = admin.get(f"/v1/jobs/{job['id']}/goodput").json()
    assert g["failures"] == 1 and g["lost_s"]["fault_detection"] >= 0
