"""Crash safety of the API: kill -9 it while clients post event batches, and fail its commits. Every batch
that got a 200 is stored exactly once; a commit that fails is never acknowledged. Real processes: a uvicorn
API on PostgreSQL restarted on the same port, four clients resending what got no answer.
"""

from __future__ import annotations

import collections
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from tests.conftest import configure_env
from tests.reliability.conftest import ApiProcess
from tests.support.waiting import wait_for


@pytest.mark.slow
@pytest.mark.postgres
def test_api_killed_mid_batch_loses_no_acknowledged_event(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Clients post event batches while the API is killed -9 and restarted on the same port; a batch
    that got a 200 is stored, exactly once; the others are sent again after the restart."""
    configure_env(monkeypatch, tmp_path / "state", postgres_url)
    from api import models
    from api.core.db import session_scope
    from api.database.tables import Event
    from api.main import create_app
    from api.schemas.spec import JobSpec

    create_app()  # migrates
    with session_scope() as session:
        job = models.jobs.create(session, JobSpec(name="batches", command=["true"]))
        _, token = models.tokens.create_trainer(session, job.id)
        job_id = job.id
    api = ApiProcess(tmp_path / "api", {"FTPLANE_DATABASE_URL": postgres_url, "FTPLANE_DATA_DIR": str(tmp_path / "s")})
    api.start()
    url = f"{api.url}/v1/jobs/{job_id}/events"
    stop = threading.Event()
    replies: dict[str, list[dict[str, int]]] = collections.defaultdict(list)  # batch -> its 200 replies
    resent: set[str] = set()  # batches sent again because a try got no answer (the kill)
    lock = threading.Lock()

    def batch(name: str) -> dict[str, Any]:
        return {"events": [{"key": f"{name}-{i}", "type": "checkpoint_saved", "step": i} for i in range(50)]}

    def client(n: int) -> None:
        """Sends its batches one after another; a batch without a 200 is sent again, same keys."""
        with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
            i = 0
            while not stop.is_set():
                name = f"c{n}-b{i}"
                while True:
                    try:
                        reply = http.post(url, json=batch(name))
                    except httpx.TransportError:
                        reply = None
                    if reply is not None and reply.status_code == 200:
                        with lock:
                            replies[name].append(reply.json())
                        break
                    with lock:
                        resent.add(name)
                    time.sleep(0.1)
                i += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for("batches to flow", lambda: len(replies) >= 20, 30)
        api.kill(signal.SIGKILL)  # mid-batch: four clients have requests in flight
        at_kill = len(replies)
        api.start()
        wait_for("batches to flow again", lambda: len(replies) >= at_kill + 20, 30)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        api.kill(signal.SIGTERM)

    assert resent, "the kill landed between requests: nothing was in flight"
    with session_scope() as session:
        keys = list(session.scalars(select(Event.key).where(Event.job_id == job_id)))
    assert len(keys) == len(set(keys)) == 50 * len(replies)
    assert set(keys) == {f"{name}-{i}" for name in replies for i in range(50)}
    for name, answers in replies.items():
        assert len(answers) == 1 and answers[0]["stored"] + answers[0]["duplicates"] == 50, (name, answers)
    # A batch committed just before the kill, whose reply was lost: its resend stored nothing again.
    stored_before_kill = [name for name in resent if replies[name][0]["duplicates"] == 50]
    assert all(replies[name][0]["duplicates"] == 0 for name in replies if name not in resent)
    assert sum(a[0]["stored"] for a in replies.values()) + 50 * len(stored_before_kill) == len(keys)
    print(
        f"\n{len(replies)} batches acknowledged; {len(resent)} sent again after the kill, "
        f"{len(stored_before_kill)} of which had been stored before it (the resend stored nothing twice)"
    )


def test_a_failed_commit_is_never_acknowledged(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reply is sent after the commit, so a commit that fails is an error, never a 200."""
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from tests.conftest import row_counts

    job = make_job()
    trainer = TestClient(admin.app, headers={"Authorization": f"Bearer {job['token']}"}, raise_server_exceptions=False)
    before = row_counts()
    real_commit = Session.commit

    def failing_commit(self: Session) -> None:
        if self.new or self.dirty or self.info.get("ftplane.after_commit"):
            raise OperationalError("COMMIT", {}, Exception("connection lost at commit"))
        real_commit(self)

    monkeypatch.setattr(Session, "commit", failing_commit)
    response = trainer.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "k", "type": "checkpoint_saved"}]})
    monkeypatch.setattr(Session, "commit", real_commit)
    assert response.status_code == 503, response.text
    assert row_counts() == before
