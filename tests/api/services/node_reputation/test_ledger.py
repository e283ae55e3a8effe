"""The node ledger over real event histories: events reported through the API as node agents and backends send
them, then the duty's pass (api/services/node_reputation/ledger.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.core.config import get_settings
from api.core.db import session_scope
from api.database.tables import Event, FleetNode, NodeFault, NodeLedgerCursor, WebhookDelivery
from api.services.node_reputation import ledger

NODE = "ip-10-0-7-12.us-west-2.compute.internal"


def report(admin: TestClient, job_id: str, *events: dict[str, Any]) -> None:
    body = {"events": [{"key": uuid.uuid4().hex, "attempt": 0, **e} for e in events]}
    answer = admin.post(f"/v1/jobs/{job_id}/events", json=body)
    assert answer.status_code == 200, answer.text


def ago(minutes: float) -> str:
    return (datetime.now(UTC) - timedelta(minutes=minutes)).isoformat()


def judge(now: datetime | None = None) -> None:
    with session_scope() as session:
        ledger.run_once(session, now)


def settled() -> datetime:
    """A pass's time at which every event stored so far has settled (the cursor may move past all of them)."""
    return datetime.now(UTC) + ledger.SETTLE + timedelta(seconds=1)


def node(admin: TestClient, name: str = NODE) -> dict[str, Any]:
    answer = admin.get(f"/v1/nodes/{name}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def node_events(admin: TestClient, job_id: str, type_: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/events", params={"type": type_}).json()["items"])


def lost(minutes: float, node_: str = NODE, **details: Any) -> dict[str, Any]:
    cause = {"cause": f"node {node_} lost (NodeNotReady)", "cause_class": "node", "reason": "NodeLost"}
    return {"type": "node_failed", "node": node_, "ts": ago(minutes), "details": {**cause, **details}}


def xid(minutes: float, node_: str = NODE) -> dict[str, Any]:
    details = {"cause": "GPU 3: critical Xid error(s) [79]", "cause_class": "node", "source": "gpu", "gpu": 3}
    return {"type": "node_unhealthy", "node": node_, "ts": ago(minutes), "details": {**details, "xid": [79]}}


@pytest.fixture
def webhook(admin: TestClient, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FTPLANE_WEBHOOK_ALLOW_PRIVATE", "true")
    get_settings.cache_clear()
    made = admin.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook"})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def deliveries_of(type_: str) -> int:
    with session_scope() as session:
        query = select(func.count()).select_from(WebhookDelivery).join(Event, Event.id == WebhookDelivery.event_id)
        return int(session.scalar(query.where(Event.type == type_)) or 0)


def test_a_node_blamed_by_two_jobs_is_quarantined_and_told_once(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], webhook: str
) -> None:
    first, second = make_job(name="first"), make_job(name="second")
    report(admin, first["id"], {"type": "running", "node": NODE, "ts": ago(30)}, lost(20))
    judge()
    assert node(admin)["state"] == "suspect"
    report(admin, second["id"], {"type": "running", "node": NODE, "ts": ago(15)}, xid(10))
    for _ in range(3):  # passes again change nothing
        judge()
    seen = node(admin)
    assert seen["state"] == "quarantined" and seen["faults"] == {"lost": 1, "xid": 1}
    assert seen["jobs"] == 2 and seen["last_fault"]["kind"] == "xid" and seen["last_fault"]["job_id"] == second["id"]
    assert "2 job(s)" in seen["reason"] and seen["quarantined_until"] is not None
    assert [h["action"] for h in seen["history"]] == ["quarantined", "suspect"]
    xid_fault = next(f for f in seen["recent_faults"] if f["kind"] == "xid")
    assert xid_fault["details"]["xid"] == [79] and xid_fault["details"]["gpu"] == 3 and xid_fault["counted"]
    # told once, on the job whose fault tipped it, with every job that counted
    (told,) = node_events(admin, second["id"], "node_quarantined")
    assert told["node"] == NODE and told["details"]["jobs"] == sorted([first["id"], second["id"]])
    assert told["details"]["quarantine"] == 1 and told["details"]["cause_class"] == "node"
    assert node_events(admin, first["id"], "node_quarantined") == []
    assert deliveries_of("node_quarantined") == 1
    listed = admin.get("/v1/nodes", params={"state": "quarantined"}).json()
    assert [n["name"] for n in listed["nodes"]] == [NODE] and listed["next_cursor"] is None


def test_one_failure_told_by_the_agent_and_the_backend_is_one_fault_of_the_most_telling_kind(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    job = make_job()
    # the agent's node_unhealthy (Xid), the pod it left failing (node_failed), the restart's exclusion of the node
    report(admin, job["id"], lost(5, pod="p-0"), xid(6))
    exclusion = {"cause": "node gone", "cause_class": "node", "node": NODE, "from_attempt": 0}
    report(admin, job["id"], {"type": "node_excluded", "node": NODE, "attempt": 1, "details": exclusion})
    judge()
    report(admin, job["id"], lost(4))  # told again, later: still the same fault
    judge()
    seen = node(admin)
    assert seen["faults"] == {"xid": 1} and seen["state"] == "suspect"
    assert [r["attempt"] for r in seen["runs"]] == [0]  # the exclusion names the node, it did not run attempt 1


def test_an_exclusion_alone_blames_its_node_as_lost(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job()
    cause = {"cause": f"node {NODE} lost: its agent was killed", "cause_class": "node", "node": NODE}
    report(
        admin, job["id"], {"type": "node_excluded", "node": NODE, "attempt": 1, "details": {**cause, "from_attempt": 0}}
    )
    other = {"cause": "rank 3 crashed", "cause_class": "crash", "node": "elsewhere", "from_attempt": 0}
    report(admin, job["id"], {"type": "node_excluded", "node": "bystander", "attempt": 1, "details": other})
    judge()
    assert node(admin)["faults"] == {"lost": 1}
    assert admin.get("/v1/nodes/bystander").status_code == 404  # named by an exclusion only, about another node


def test_preemptions_and_injected_faults_are_shown_never_counted(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    drained, tested = make_job(name="drained"), make_job(name="chaos")
    preempted = {
        "cause": "evicted through the Eviction API",
        "cause_class": "preempted",
        "reason": "EvictionByEvictionAPI",
    }
    report(admin, drained["id"], {"type": "preempted", "node": NODE, "ts": ago(9), "details": preempted})
    injected = {"kind": "node_loss", "fault_id": "f1", "source": "control_plane", "delivery": "agent"}
    report(
        admin,
        tested["id"],
        {"type": "fault_injected", "node": NODE, "rank": 0, "ts": ago(8), "details": injected},
        lost(8, cause="node lost (injected)"),
    )
    judge()
    seen = node(admin)
    assert seen["faults"] == {"preempted": 1, "injected": 1} and seen["state"] == "healthy"
    assert seen["last_fault"] is None
    as_injected = next(f for f in seen["recent_faults"] if f["kind"] == "injected")
    assert as_injected["details"]["as"] == "lost" and not as_injected["counted"]


def test_each_straggler_episode_is_a_fault(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    job = make_job()
    for episode in ("e1", "e2"):
        details = {"cause": "rank 5 ran at 0.61 of the job's pace", "cause_class": "straggler", "episode": episode}
        report(
            admin,
            job["id"],
            {"type": "straggler_detected", "node": NODE, "rank": 5, "details": {**details, "score": 0.61}},
        )
    judge()
    seen = node(admin)
    assert seen["faults"] == {"straggler": 2} and seen["state"] == "suspect"  # one job: suspect, not quarantined


def test_faults_outside_the_window_do_not_count(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    first, second = make_job(name="first"), make_job(name="second")
    report(admin, first["id"], lost(60 * 30))  # 30 h ago: outside the day's window
    report(admin, second["id"], lost(5))
    judge()
    seen = node(admin)
    assert seen["faults"] == {"lost": 2} and seen["state"] == "suspect"


def test_a_quarantine_ends_by_itself_and_its_end_is_told_where_it_began(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FTPLANE_NODE_QUARANTINE_S", "600")
    get_settings.cache_clear()
    first, second = make_job(name="first"), make_job(name="second")
    report(admin, first["id"], lost(30))
    report(admin, second["id"], lost(20))
    judge()
    assert node(admin)["state"] == "quarantined"
    judge(datetime.now(UTC) + timedelta(seconds=300))
    assert node(admin)["state"] == "quarantined"
    judge(datetime.now(UTC) + timedelta(seconds=601))
    seen = node(admin)
    assert seen["state"] == "healthy" and seen["quarantined_until"] is None
    assert [h["action"] for h in seen["history"]][:2] == ["released", "quarantined"]
    assert seen["history"][0]["actor"] == "ftplane" and seen["history"][0]["reason"] == "its quarantine ended"
    (released,) = node_events(admin, second["id"], "node_released")
    assert released["details"]["quarantine"] == 1
    judge(datetime.now(UTC) + timedelta(seconds=700))  # the faults before it are forgiven: healthy it stays
    assert node(admin)["state"] == "healthy"


def test_the_cursor_moves_only_past_settled_events_and_reading_again_changes_nothing(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    job = make_job()
    report(admin, job["id"], {"type": "running", "node": NODE}, lost(1))
    judge()  # just received: read, but not settled
    assert cursor() == 0 and faults() == 1
    judge()
    assert faults() == 1
    judge(settled())
    with session_scope() as session:
        assert cursor() == session.scalar(select(func.max(Event.id)))
    assert faults() == 1 and node(admin)["jobs"] == 1


def test_a_process_records_an_unsettled_event_once_and_a_late_one_when_it_shows(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cursor waits for late commits, so a pass reads the unsettled events again; the process skips those it
    recorded, but not one that became visible since (a lower id, committed late), nor any once another process's
    pass moved the cursor."""
    from sqlalchemy import delete, update

    recorded: list[list[int]] = []
    record_runs = ledger._record_runs

    def spy(session: Any, heads: Any, blames: Any) -> None:
        recorded.append([h.id for h in heads])
        record_runs(session, heads, blames)

    monkeypatch.setattr(ledger, "_record_runs", spy)
    job = make_job()
    report(admin, job["id"], *({"type": "checkpoint_saved", "node": f"n{i}", "step": i} for i in range(3)))
    with session_scope() as session:
        ids = list(session.scalars(select(Event.id).order_by(Event.id)))
        late = session.get_one(Event, ids[1])
        row = {c.name: getattr(late, c.name) for c in Event.__table__.columns}
        session.execute(delete(Event).where(Event.id == ids[1]))  # not visible yet
    judge()
    judge()
    assert recorded == [[ids[0], ids[2]], []] and cursor() == 0
    with session_scope() as session:
        session.execute(Event.__table__.insert().values(**row))  # its transaction commits: it shows, below the others
    judge()
    assert recorded[-1] == [ids[1]]
    with session_scope() as session:  # another process's pass
        session.execute(update(NodeLedgerCursor).values(updated_at=datetime.now(UTC)))
    judge()
    assert recorded[-1] == ids
    judge(settled())
    assert cursor() == ids[-1] and node(admin, "n1")["jobs"] == 1


def test_a_pass_reads_at_most_its_batches(
    admin: TestClient, make_job: Callable[..., dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = make_job()
    report(admin, job["id"], *({"type": "checkpoint_saved", "node": f"n{i}", "step": i} for i in range(5)))
    monkeypatch.setattr(ledger, "BATCH", 2)
    monkeypatch.setattr(ledger, "MAX_BATCHES", 1)
    judge(settled())
    first = cursor()
    judge(settled())
    assert 0 < first < cursor()


def test_node_names_are_recorded_as_the_fleet_names_them(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    job = make_job()
    report(admin, job["id"], {"type": "running", "node": "MyHost-n0"}, {"type": "running", "node": "not a name!"})
    judge()
    with session_scope() as session:
        assert list(session.scalars(select(FleetNode.name))) == ["myhost-n0"]


def test_nodes_and_runs_seen_again_move_only_their_last_seen_forward(make_job: Callable[..., dict[str, Any]]) -> None:
    """The ledger's rows written together (on PostgreSQL one JSON array per column): a new node is healthy; one
    seen again keeps its first sighting and its state, and its `last_seen` moves forward, never back."""
    from sqlalchemy import update

    from api.database.tables import NodeRun
    from api.models import node_ledger

    job_id = make_job()["id"]
    at = datetime(2026, 12, 7, 12, 0, 0, 123456, tzinfo=UTC)
    minute = timedelta(minutes=1)
    with session_scope() as session:  # in no order: the database takes them in key order
        node_ledger.ensure_nodes(session, {"n-b": (at, at + minute), "n-a": (at, at)})
        node_ledger.record_runs(session, {("n-b", job_id, 1): (at, at + minute), ("n-a", job_id, 0): (at, at)})
        session.execute(update(FleetNode).where(FleetNode.name == "n-a").values(state="suspect"))
    with session_scope() as session:
        node_ledger.ensure_nodes(session, {"n-a": (at + minute, at + 2 * minute), "n-b": (at + minute, at)})
        node_ledger.record_runs(
            session, {("n-a", job_id, 0): (at + minute, at + 2 * minute), ("n-b", job_id, 1): (at, at)}
        )
    with session_scope() as session:
        nodes = {
            n.name: (n.state, n.quarantines, n.first_seen, n.last_seen) for n in session.scalars(select(FleetNode))
        }
        runs = {(r.node, r.attempt): (r.first_seen, r.last_seen) for r in session.scalars(select(NodeRun))}
    assert nodes == {"n-a": ("suspect", 0, at, at + 2 * minute), "n-b": ("healthy", 0, at, at + minute)}
    assert runs == {("n-a", 0): (at, at + 2 * minute), ("n-b", 1): (at, at + minute)}


def cursor() -> int:
    with session_scope() as session:
        return int(session.scalar(select(NodeLedgerCursor.position)) or 0)


def faults() -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.count()).select_from(NodeFault)) or 0)
