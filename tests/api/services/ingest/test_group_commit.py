"""Reports whose events cannot change their job, stored many to one transaction: each reply says what of its own
was stored, a key sent twice is stored once, and what cannot be stored together is handed back to be stored alone."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api import models
from api.core.db import session_scope
from api.core.errors import ApiError
from api.database.tables import Event
from api.schemas.reports import NodeReport
from api.services import lifecycle
from api.services.ingest import group_commit
from api.services.ingest.group_commit import GroupCommit, _Waiting
from tests.api.services.ingest.test_node_reports import as_trainer, report
from tests.support.waiting import wait_for


def running(key: str, rank: int) -> dict[str, Any]:
    return {"key": key, "type": "running", "rank": rank, "step": 0, "details": {"restart_count": 0, "iteration": 0}}


def waiting(job_id: str, node: str, events: list[dict[str, Any]]) -> _Waiting:
    return _Waiting(job_id, NodeReport.model_validate(report(node, events=events)), look_for_faults=False)


def running_job(admin: TestClient, make_job: Any) -> dict[str, Any]:
    job = make_job()
    posted = as_trainer(admin, job["token"]).post(
        f"/v1/jobs/{job['id']}/reports", json=report(events=[running("a", 0)])
    )
    assert posted.status_code == 200 and admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    return job


def events_of(job_id: str) -> dict[str, int]:
    with session_scope() as session:
        rows = session.execute(select(Event.key, func.count()).where(Event.job_id == job_id).group_by(Event.key))
        return {key: count for key, count in rows}


def test_reports_of_several_nodes_and_jobs_share_a_transaction_and_each_reply_counts_its_own(
    admin: TestClient, make_job: Any
) -> None:
    job, other = running_job(admin, make_job), running_job(admin, make_job)
    batch = [
        waiting(job["id"], "n0", [running("r0", 0), running("r1", 1)]),
        waiting(job["id"], "n1", [running("r1", 1), running("r2", 2)]),  # r1 also sent by n0 (a resend race)
        waiting(other["id"], "n0", [running("r0", 0)]),
        waiting(job["id"], "n0", [running("r0", 0)]),  # a resend of the first
    ]
    GroupCommit().store(batch)
    results = [w.answer.result(timeout=0) for w in batch]
    assert all(r is not None for r in results)
    counts = [(r[0].stored, r[0].duplicates) for r in results if r is not None]
    assert counts == [(2, 0), (1, 1), (1, 0), (0, 1)]
    assert events_of(job["id"]) == {"a": 1, "r0": 1, "r1": 1, "r2": 1}
    assert events_of(other["id"]) == {"a": 1, "r0": 1}


def test_a_report_that_would_change_its_job_is_handed_back_the_others_stored(admin: TestClient, make_job: Any) -> None:
    """The route saw the job RUNNING; meanwhile it is RECOVERING, so a `running` would change it: that report is
    answered None (the route stores it alone, exclusively), a checkpoint report beside it is stored."""
    job = running_job(admin, make_job)
    with session_scope() as session:
        row = models.jobs.get(session, job["id"], for_update=True)
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.RECOVERING)
    saved = {"key": "c1", "type": "checkpoint_saved", "step": 10, "details": {"step": 10}}
    batch = [waiting(job["id"], "n0", [running("r0", 0)]), waiting(job["id"], "n1", [saved])]
    GroupCommit().store(batch)
    assert batch[0].answer.result(timeout=0) is None
    stored = batch[1].answer.result(timeout=0)
    assert stored is not None and stored[0].stored == 1
    assert events_of(job["id"]) == {"a": 1, "c1": 1}


def test_reports_that_change_their_job_are_stored_together_under_the_exclusive_lock(
    admin: TestClient, make_job: Any
) -> None:
    """After a restart every node's `running` finds the job RECOVERING: the route marks them exclusive, the batch
    locks the row exclusively, stores them all and applies what they mean once (RECOVERING -> RUNNING)."""
    job = running_job(admin, make_job)
    with session_scope() as session:
        row = models.jobs.get(session, job["id"], for_update=True)
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.RECOVERING)
    batch = [waiting(job["id"], f"n{n}", [running(f"r{n}", n)]) for n in range(3)]
    for w in batch:
        w.exclusive = True
    GroupCommit().store(batch)
    assert [w.answer.result(timeout=0)[0].stored for w in batch] == [1, 1, 1]  # type: ignore[index]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"


def test_a_report_without_events_for_an_ended_job_is_a_409(admin: TestClient, make_job: Any) -> None:
    job = running_job(admin, make_job)
    with session_scope() as session:
        row = models.jobs.get(session, job["id"], for_update=True)
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.CANCELLED)
    late = _Waiting(job["id"], NodeReport.model_validate(report("n0")), look_for_faults=True, exclusive=True)
    GroupCommit().store([late])
    with pytest.raises(ApiError) as ended:
        late.answer.result(timeout=0)
    assert ended.value.status == 409


def test_a_report_whose_request_went_away_is_not_stored_and_the_others_are_answered(
    admin: TestClient, make_job: Any
) -> None:
    job = running_job(admin, make_job)
    gone, kept = waiting(job["id"], "n0", [running("r0", 0)]), waiting(job["id"], "n1", [running("r1", 1)])
    assert gone.answer.cancel()  # what asyncio.wrap_future does when the client disconnects
    GroupCommit().store([gone, kept])
    assert kept.answer.result(timeout=0) is not None and events_of(job["id"]) == {"a": 1, "r1": 1}


def test_a_failed_batch_stores_nothing_and_hands_every_report_back(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = running_job(admin, make_job)
    batch = [waiting(job["id"], "n0", [running("r0", 0)]), waiting(job["id"], "n1", [running("r1", 1)])]
    calls = 0

    def announce_then_fail(*args: Any) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("the database went away mid-batch")

    monkeypatch.setattr("api.services.notifications.events_stored", announce_then_fail)
    GroupCommit().store(batch)
    assert calls == 1 and [w.answer.result(timeout=0) for w in batch] == [None, None]
    assert events_of(job["id"]) == {"a": 1}  # rolled back: each is stored alone by its route


def test_a_report_for_a_job_that_is_gone_is_a_404_its_neighbours_stored(admin: TestClient, make_job: Any) -> None:
    job = running_job(admin, make_job)
    batch = [waiting("no-such-job", "n0", [running("r0", 0)]), waiting(job["id"], "n0", [running("r0", 0)])]
    GroupCommit().store(batch)
    with pytest.raises(ApiError) as missing:
        batch[0].answer.result(timeout=0)
    assert missing.value.status == 404 and missing.value.field == "job_id"
    assert events_of(job["id"]) == {"a": 1, "r0": 1}


def test_reports_posted_at_once_are_stored_together_and_each_reply_comes_after_its_commit(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the route: while one batch is being stored the next reports wait, and are then stored together in
    one transaction; every reply finds its events in the database."""
    job = running_job(admin, make_job)
    trainer = as_trainer(admin, job["token"])
    first_batch_entered, release = threading.Event(), threading.Event()
    sizes: list[int] = []
    real_store = GroupCommit.store

    def slow_store(self: GroupCommit, batch: list[_Waiting]) -> None:
        sizes.append(len(batch))
        if len(sizes) == 1:
            first_batch_entered.set()
            assert release.wait(30)
        real_store(self, batch)

    monkeypatch.setattr(GroupCommit, "store", slow_store)
    monkeypatch.setattr(group_commit, "_group_commit", None)
    replies: dict[int, tuple[int, int, int | None]] = {}

    def post(node: int) -> None:
        body = report(f"n{node}", ranks=(node,), events=[running(f"r{node}", node)])
        reply = trainer.post(f"/v1/jobs/{job['id']}/reports", json=body)
        replies[node] = (reply.status_code, reply.json()["stored"], events_of(job["id"]).get(f"r{node}"))

    threads = [threading.Thread(target=post, args=(0,))]
    threads[0].start()
    assert first_batch_entered.wait(30)
    threads += [threading.Thread(target=post, args=(n,)) for n in range(1, 6)]
    for thread in threads[1:]:
        thread.start()
    wait_for("5 reports waiting", lambda: group_commit.group_commit()._waiting.qsize() == 5, timeout=30)
    release.set()
    for thread in threads:
        thread.join(30)
    assert sizes == [1, 5]
    assert replies == {n: (200, 1, 1) for n in range(6)}  # each stored once, and in the database at its reply
