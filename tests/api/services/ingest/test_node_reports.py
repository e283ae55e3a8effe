"""A node agent's batched report: who may send it, what it stores (once), what it answers, and what the
supervisor makes of nodes that stop reporting."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.support.supervision import ScriptedBackend, supervise, use_backend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


def report(node: str = "n0", ranks: tuple[int, ...] = (0, 1), **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "attempt": 0,
        "node": node,
        "agent": {
            "pid": 10,
            "launcher": {"pid": 11, "alive": True},
            "ranks": [{"rank": r, "local_rank": i, "pid": 100 + r, "alive": True} for i, r in enumerate(ranks)],
            "progress": "none",
        },
    }
    body.update(extra)
    return body


def as_trainer(admin: TestClient, token: str) -> TestClient:
    return TestClient(admin.app, headers={"Authorization": f"Bearer {token}"})


def test_a_report_stores_liveness_heartbeats_and_events_once(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    trainer = as_trainer(admin, job["token"])
    events = [{"key": "e1", "type": "checkpoint_saved", "step": 10, "details": {"step": 10, "blocking_s": 0.1}}]
    beats = [{"rank": 0, "step": 12, "step_time_s": 0.5, "total_steps": 100}, {"rank": 1, "step": 11}]
    body = report(events=events, heartbeats=beats)
    first = trainer.post(f"/v1/jobs/{job['id']}/reports", json=body)
    assert first.status_code == 200, first.text
    assert first.json() == {"stored": 1, "duplicates": 0, "accepted": 2, "faults": []}
    again = trainer.post(f"/v1/jobs/{job['id']}/reports", json=body).json()
    assert again["stored"] == 0 and again["duplicates"] == 1  # a resend after a lost reply stores nothing twice
    (node,) = admin.get(f"/v1/jobs/{job['id']}/nodes").json()
    assert node["node"] == "n0" and node["launcher_alive"] and [r["rank"] for r in node["ranks"]] == [0, 1]
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["progress"]["total_steps"] == 100 and detail["progress"]["step"] == 12
    assert detail["progress"]["step_time_s"] == 0.5 and detail["progress"]["hang_detection"] == "rank"


def test_a_jobs_step_time_is_the_median_of_its_ranks_measured_ones(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    times = [1.0, 0.2, 0.6, 0.4, 0.0]  # a rank at 0 has measured nothing yet, nor one that sends none
    beats = [{"rank": r, "step": 5, "step_time_s": t} for r, t in enumerate(times)] + [{"rank": 5, "step": 5}]
    sent = as_trainer(admin, job["token"]).post(
        f"/v1/jobs/{job['id']}/reports", json=report(ranks=tuple(range(6)), heartbeats=beats)
    )
    assert sent.status_code == 200, sent.text
    assert admin.get(f"/v1/jobs/{job['id']}").json()["progress"]["step_time_s"] == pytest.approx(0.5)


def test_a_jobs_ranks_and_nodes_come_a_page_at_a_time(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job of 131,072 ranks is 25 MB of ranks: a tool pages them by rank (nodes by name); the client does."""
    from ftplane import client

    job = make_job()
    trainer = as_trainer(admin, job["token"])
    for n in range(3):
        ranks = (2 * n, 2 * n + 1)
        beats = [{"rank": r, "step": 1} for r in ranks]
        sent = trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(node=f"n{n}", ranks=ranks, heartbeats=beats))
        assert sent.status_code == 200, sent.text

    def listed(what: str, **params: Any) -> list[Any]:
        response = admin.get(f"/v1/jobs/{job['id']}/{what}", params=params)
        assert response.status_code == 200, response.text
        return [item["rank" if what == "ranks" else "node"] for item in response.json()]

    assert listed("ranks") == [0, 1, 2, 3, 4, 5]
    assert listed("ranks", limit=4) == [0, 1, 2, 3] and listed("ranks", after=3, limit=4) == [4, 5]
    assert listed("ranks", after=5) == [] and listed("nodes", after="n0", limit=1) == ["n1"]
    assert listed("nodes") == ["n0", "n1", "n2"] and listed("nodes", after="n1") == ["n2"]
    for what, params, field in (("ranks", {"limit": 0}, "limit"), ("ranks", {"after": -2}, "after")):
        refused = admin.get(f"/v1/jobs/{job['id']}/{what}", params=params)
        assert refused.status_code == 422 and field in refused.text
    monkeypatch.setattr(client, "RANKS_PAGE", 4)
    api = client.Client(token="unused")
    api.http = admin  # the app in this process (a TestClient is an httpx.Client)
    assert [r["rank"] for r in api.ranks(job["id"])] == [0, 1, 2, 3, 4, 5]


def test_who_may_report(admin: TestClient, make_job: Any) -> None:
    job, other = make_job(), make_job()
    anonymous = TestClient(admin.app)
    assert anonymous.post(f"/v1/jobs/{job['id']}/reports", json=report()).status_code == 401
    stranger = as_trainer(admin, other["token"]).post(f"/v1/jobs/{job['id']}/reports", json=report())
    assert stranger.status_code == 403
    bad = as_trainer(admin, job["token"]).post(
        f"/v1/jobs/{job['id']}/reports", json=report(agent={"ranks": [{"rank": -1, "alive": True}]})
    )
    assert bad.status_code == 422 and "agent.ranks[0].rank" in bad.text
    unknown = as_trainer(admin, job["token"]).post(f"/v1/jobs/{job['id']}/reports", json=report(nodes=3))
    assert unknown.status_code == 422 and "nodes" in unknown.text


def test_an_ended_job_takes_no_more_reports_but_its_last_events(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    admin.post(f"/v1/jobs/{job['id']}/cancel")
    trainer = as_trainer(admin, job["token"])
    assert trainer.post(f"/v1/jobs/{job['id']}/reports", json=report()).status_code == 409


def test_faults_for_the_ranks_code_ride_every_reply_until_fired(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    fault = admin.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "exception", "rank": 1, "at_step": 30}).json()
    assert fault["delivery"] == "trainer"
    trainer = as_trainer(admin, job["token"])
    for _ in range(2):
        reply = trainer.post(f"/v1/jobs/{job['id']}/reports", json=report()).json()
        assert [(f["id"], f["delivery"], f["at_step"]) for f in reply["faults"]] == [(fault["id"], "trainer", 30)]
    fired = {"key": f"fault:{fault['id']}", "type": "fault_injected", "rank": 1, "details": {"fault_id": fault["id"]}}
    reply = trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(events=[fired])).json()
    assert reply["faults"] == []


def test_a_fault_outside_the_ranks_code_reaches_the_node_agent_once(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job()
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    fault = admin.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "crash", "rank": 1, "now": True}).json()
    assert fault["delivery"] == "agent"
    beat = admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 1, "step": 2}]}).json()
    assert beat["faults"] == []  # not handed to the rank's code
    on_n0 = {"attempt": 0, "node": "n0", "agent": {"ranks": [{"rank": 0, "alive": True}]}}
    reply = admin.post(f"/v1/jobs/{job['id']}/reports", json=on_n0).json()
    assert reply["faults"] == []  # rank 1 is not on this node
    on_n1 = {"attempt": 0, "node": "n1", "agent": {"ranks": [{"rank": 1, "alive": True}]}}
    reply = admin.post(f"/v1/jobs/{job['id']}/reports", json=on_n1).json()
    assert [(f["id"], f["kind"], f["rank"], f["delivery"]) for f in reply["faults"]] == [
        (fault["id"], "crash", 1, "agent")
    ]
    again = admin.post(f"/v1/jobs/{job['id']}/reports", json=on_n1).json()
    assert again["faults"] == []  # at most once


def test_a_zero_code_job_has_node_level_hang_detection_and_no_false_hang(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    job = make_job(resiliency={"heartbeat_timeout_s": 10, "initial_heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    supervise()  # running
    trainer = as_trainer(admin, job["token"])
    trainer.post(f"/v1/jobs/{job['id']}/reports", json=report())
    with pytest.MonkeyPatch.context() as clock:
        from api.schemas import events as event_schemas
        from workers.supervision import detect_silent_ranks

        later = event_schemas.utcnow() + timedelta(seconds=25)  # past the initial timeout, and twice it
        clock.setattr(detect_silent_ranks, "utcnow", lambda: later)
        supervise()  # its processes live, its ranks report no steps: nothing says it hangs
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["progress"]["hang_detection"] == "node"
    assert admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"] == []
    assert detail["attempt"] == 0


def test_a_node_whose_agent_goes_silent_is_lost_and_excluded(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.core.db import session_scope
    from api.database.tables import NodeLiveness
    from api.schemas.events import utcnow

    job = make_job(nodes=2, resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    supervise()
    trainer = as_trainer(admin, job["token"])
    for node, ranks in (("n0", (0, 1)), ("n1", (2, 3))):
        trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(node, ranks))

    def silent_for(node: str, seconds: float) -> None:
        from api.services.ingest import liveness_writer

        liveness_writer.flush()
        with session_scope() as session:
            row = session.get(NodeLiveness, (job["id"], node))
            assert row is not None
            row.last_seen = utcnow() - timedelta(seconds=seconds)

    silent_for("n1", 12)
    supervise()
    supervise()  # recorded once
    lost = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "heartbeat_lost"}).json()["items"]
    assert [(e["node"], e["details"]["cause_class"]) for e in lost] == [("n1", "node")]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 0

    silent_for("n1", 25)
    trainer.post(f"/v1/jobs/{job['id']}/reports", json=report("n0", (0, 1)))  # the other node still reports
    supervise()
    detail = admin.get(f"/v1/jobs/{job['id']}").json()
    assert detail["attempt"] == 1 and detail["excluded_nodes"] == ["n1"]
    assert "node lost" in detail["status_reason"]


def test_when_every_node_is_silent_no_node_is_blamed(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.core.db import session_scope
    from api.database.tables import NodeLiveness
    from api.schemas.events import utcnow

    job = make_job(nodes=2, resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    supervise()
    trainer = as_trainer(admin, job["token"])
    for node, ranks in (("n0", (0, 1)), ("n1", (2, 3))):
        trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(node, ranks))
    from api.services.ingest import liveness_writer

    liveness_writer.flush()
    with session_scope() as session:
        for row in session.query(NodeLiveness).filter_by(job_id=job["id"]):
            row.last_seen = utcnow() - timedelta(seconds=60)
    supervise()
    assert admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "heartbeat_lost"}).json()["items"] == []


def test_the_job_page_shows_progress_and_the_hang_detection_level(admin: TestClient, make_job: Any) -> None:
    job = make_job()
    trainer = as_trainer(admin, job["token"])
    page = admin.get(f"/jobs/{job['id']}")
    assert "node-level only" in page.text
    beats = [{"rank": 0, "step": 25, "step_time_s": 2.0, "total_steps": 100}]
    trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(heartbeats=beats))
    page = admin.get(f"/jobs/{job['id']}")
    assert "step 25 of 100 (25 %)" in page.text and "per rank" in page.text and "n0" in page.text


def test_a_revoked_token_stops_reporting_within_the_cache_ttl(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.core.config import get_settings
    from tests.support.waiting import wait_for

    monkeypatch.setenv("FTPLANE_AUTH_CACHE_TTL_S", "0.5")
    get_settings.cache_clear()
    job = make_job()
    trainer = as_trainer(admin, job["token"])
    assert trainer.post(f"/v1/jobs/{job['id']}/reports", json=report()).status_code == 200  # now cached
    token_id = next(t["id"] for t in admin.get("/v1/tokens").json() if t.get("job_id") == job["id"])
    from api.core.db import session_scope
    from api.models import tokens

    with session_scope() as session:
        assert tokens.revoke(session, token_id)
    refused_at = wait_for(
        "the revocation to reach the report route",
        lambda: trainer.post(f"/v1/jobs/{job['id']}/reports", json=report()).status_code == 401,
        timeout=5,
        interval=0.05,
    )
    assert refused_at


def test_liveness_is_written_within_the_flush_period_and_a_failing_database_answers_503(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy.exc import OperationalError

    from api.core.db import session_scope
    from api.database.tables import RankLiveness
    from api.services.ingest import liveness_writer
    from tests.support.waiting import wait_for

    job = make_job()
    trainer = as_trainer(admin, job["token"])
    beats = [{"rank": 0, "step": 5}, {"rank": 1, "step": 5}]
    assert trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(heartbeats=beats)).json()["accepted"] == 2

    def stored() -> int:
        with session_scope() as session:
            return session.query(RankLiveness).filter_by(job_id=job["id"]).count()

    wait_for("the writer's next write", lambda: stored() == 2, timeout=5, interval=0.02)

    writer = liveness_writer.writer()
    real = writer.database

    def database_away() -> Any:
        raise OperationalError("connect", {}, Exception("connection refused"))

    monkeypatch.setattr(writer, "database", database_away)
    newer = [{"rank": 0, "step": 9}]
    trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(heartbeats=newer))
    wait_for("a failed write", lambda: not writer.healthy, timeout=5, interval=0.02)
    refused = trainer.post(f"/v1/jobs/{job['id']}/reports", json=report())
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    monkeypatch.setattr(writer, "database", real)
    wait_for("the kept liveness written", lambda: writer.healthy, timeout=15, interval=0.05)
    steps = {r["rank"]: r["step"] for r in admin.get(f"/v1/jobs/{job['id']}/ranks").json()}
    assert steps == {0: 9, 1: 5}
    assert trainer.post(f"/v1/jobs/{job['id']}/reports", json=report()).status_code == 200


def test_past_the_transaction_slots_a_report_is_shed_its_liveness_kept_its_events_resent_once(
    admin: TestClient, make_job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a restart every node's `running` comes at once: past the process's slots a report is answered 503 with
    Retry-After, its liveness taken on the fast path (the node is not silent meanwhile), nothing stored; the
    agent's resend stores each event once."""
    from api.services.ingest import admission

    job = make_job()
    trainer = as_trainer(admin, job["token"])
    full = admission.TransactionSlots(0)
    monkeypatch.setattr(admission, "slots", lambda kind, limit: full)
    events = [{"key": "run-0", "type": "checkpoint_saved", "step": 10, "details": {"step": 10}}]
    body = report("n7", events=events, heartbeats=[{"rank": 0, "step": 10}])
    shed = trainer.post(f"/v1/jobs/{job['id']}/reports", json=body)
    assert shed.status_code == 503 and shed.headers["Retry-After"] in ("1", "2") and full.shed == 1
    assert shed.json()["error"]["liveness_taken"] is True and shed.json()["error"]["accepted"] == 1
    assert admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "checkpoint_saved"}).json()["items"] == []
    assert [n["node"] for n in admin.get(f"/v1/jobs/{job['id']}/nodes").json()] == ["n7"]  # liveness taken
    assert {r["rank"]: r["step"] for r in admin.get(f"/v1/jobs/{job['id']}/ranks").json()} == {0: 10}
    monkeypatch.undo()
    for _ in range(2):  # the resend, and a resend of it
        assert trainer.post(f"/v1/jobs/{job['id']}/reports", json=body).status_code == 200
    stored = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "checkpoint_saved"}).json()["items"]
    assert [e["key"] for e in stored] == ["run-0"]


def test_a_report_stored_under_the_shared_lock_redoes_itself_exclusively_when_the_job_changed_meanwhile(
    admin: TestClient, make_job: Any
) -> None:
    """Reports whose events cannot change the job are stored side by side (a shared lock on its row); the route
    decides from its cached view of the job, and when the row says otherwise the report is stored again under the
    exclusive lock, so what the event means is applied."""
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    job = make_job()
    trainer = as_trainer(admin, job["token"])
    running = {"type": "running", "rank": 0, "step": 0, "details": {"restart_count": 0, "iteration": 0}}
    assert (
        trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(events=[{**running, "key": "r0"}])).status_code == 200
    )
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"
    trainer.post(f"/v1/jobs/{job['id']}/reports", json=report())  # the route's cached view: RUNNING
    with session_scope() as session:  # the supervisor moves the job on; the route's cache does not know yet
        row = models.jobs.get(session, job["id"], for_update=True)
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.RECOVERING)
    again = trainer.post(f"/v1/jobs/{job['id']}/reports", json=report(events=[{**running, "key": "r1"}]))
    assert again.status_code == 200 and again.json()["stored"] == 1
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING"  # applied: RECOVERING -> RUNNING
