"""Liveness rows as the writer stores them: every value kept, newest wins against a row written late."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.services.ingest.test_node_reports import report


def test_liveness_rows_written_together_keep_every_value_and_refuse_one_too_long(make_job: Any) -> None:
    """Rows written in one statement (on PostgreSQL one JSON array per column) come back as written: nulls, quotes,
    backslashes and non-ASCII text, floats, each row its own; on PostgreSQL (SQLite keeps any length) a value too long
    for its column fails the write, is never cut to fit."""
    from datetime import UTC, datetime

    from sqlalchemy.exc import DBAPIError

    from api.core.db import session_scope
    from api.database.tables import RankLiveness
    from api.models import liveness

    job_id = make_job()["id"]
    at = datetime(2026, 12, 3, 12, 0, 0, 123456, tzinfo=UTC)
    nodes = ['node "a"\\b', "nœud-é", None]
    rows = [
        {
            "job_id": job_id,
            "rank": rank,
            "attempt": 0,
            "node": nodes[rank % 3],
            "step": 2**40 + rank,
            "last_seen": at + timedelta(seconds=rank),
            "throughput": 1.5e300 if rank == 1 else None,
            "loss": -0.1 * rank,
            "step_time_s": 0.42,
            "compute_s": None,
            "perf_score": 0.0,
        }
        for rank in (2, 0, 1)  # in no order: the database takes them in key order
    ]
    with session_scope() as session:
        liveness.write_ranks(session, rows)
    with session_scope() as session:
        stored = {
            r.rank: {c: getattr(r, c) for c in rows[0]}
            for r in session.query(RankLiveness).filter_by(job_id=job_id).all()
        }
    for row in stored.values():
        row["last_seen"] = row["last_seen"].astimezone(UTC)
    assert stored == {row["rank"]: row for row in rows}

    with session_scope() as session:
        if session.get_bind().dialect.name != "postgresql":
            return
    too_long = {**rows[0], "node": "n" * 254}  # the column holds 253
    with pytest.raises(DBAPIError, match="too long"), session_scope() as session:
        liveness.write_ranks(session, [too_long])
    with session_scope() as session:
        assert session.get_one(RankLiveness, (job_id, 2)).node == rows[0]["node"]


def test_a_nodes_older_liveness_written_late_never_overwrites_a_newer_one(admin: TestClient, make_job: Any) -> None:
    """The coalescing writer may write a node's row after a later report of the node was stored in its own
    transaction: node rows are upserted newest-wins, as rank rows are."""
    from datetime import UTC, datetime

    from api.core.db import session_scope
    from api.database.tables import NodeLiveness
    from api.models import nodes
    from api.schemas.reports import NodeReport

    job_id = make_job()["id"]
    t0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    unhealthy = report("n1")
    unhealthy["agent"]["healthy"] = False
    newer = nodes.node_row(job_id, NodeReport.model_validate(unhealthy), t0 + timedelta(seconds=2))
    older = nodes.node_row(job_id, NodeReport.model_validate(report("n1")), t0)
    for row in (newer, older):  # the newer first, as when the writer's flush comes after the transaction
        with session_scope() as session:
            nodes.write_nodes(session, [row])
    with session_scope() as session:
        (stored,) = session.query(NodeLiveness).filter_by(job_id=job_id).all()
        assert stored.last_seen == t0 + timedelta(seconds=2) and stored.healthy is False

    # every column as the report said it, and a new attempt's row wins over a later-seen row of the old one
    restarted = report("n1", ranks=(4, 5), attempt=1)
    restarted["agent"].update(
        progress="log",
        healthy=False,
        unhealthy_reason="GPU 1: Xid 79 — fallen off the bus",
        launcher={"pid": 12, "alive": False},
        gpus=[{"index": 1, "xid_errors": [79], "ecc_uncorrected": 2, "throttled": ["HW_SLOWDOWN"]}],
    )
    newest = nodes.node_row(job_id, NodeReport.model_validate(restarted), t0 + timedelta(seconds=1))
    late_old = nodes.node_row(job_id, NodeReport.model_validate(report("n1")), t0 + timedelta(seconds=3))
    for row in (newest, late_old):
        with session_scope() as session:
            nodes.write_nodes(session, [row])
    with session_scope() as session:
        (stored,) = session.query(NodeLiveness).filter_by(job_id=job_id).all()
        columns = ("attempt", "last_seen", "launcher_alive", "progress", "healthy", "unhealthy_reason", "ranks", "gpus")
        assert {c: getattr(stored, c) for c in columns} == {c: newest[c] for c in columns}


def test_the_database_counts_a_jobs_ranks_and_picks_the_stalest_ranks_and_the_nodes_needing_attention(
    make_job: Any,
) -> None:
    """What a job page past its bounds reads (api/services/job_liveness_view.py), on both databases."""
    from api.core.db import session_scope
    from api.models import liveness, nodes
    from api.schemas.events import utcnow

    job_id = make_job()["id"]
    now = utcnow()
    silent_for = {4: 100.0, 5: 200.0, 6: 300.0}
    row = {"job_id": job_id, "step": 9, "throughput": None, "loss": None, "step_time_s": None, "compute_s": None}
    ranks = [
        row
        | {"rank": r, "attempt": 0, "node": f"n{r // 2}", "perf_score": None}
        | {"last_seen": now - timedelta(seconds=silent_for.get(r, 1.0))}
        for r in (*range(7), 9)  # rank 7 never heard; rank 9 past the spec's 8
    ]
    ranks.append(ranks.pop() | {"attempt": 1})  # not the attempt counted
    healthy = {"attempt": 0, "last_seen": now, "launcher_alive": True, "progress": "sdk", "healthy": True}
    agents = [
        {"job_id": job_id, "node": f"n{n}", "unhealthy_reason": None, "ranks": [], "gpus": []} | healthy
        for n in range(5)
    ]
    agents[1] |= {"launcher_alive": False}
    agents[3] |= {"healthy": False}
    agents[4] |= {"last_seen": now - timedelta(seconds=91)}
    with session_scope() as session:
        liveness.write_ranks(session, ranks)
        nodes.write_nodes(session, agents)
    cutoff = now - timedelta(seconds=90)
    with session_scope() as session:
        counts = liveness.rank_counts(session, job_id, 0, cutoff, 8)
        assert (counts.highest, counts.seen_in_world, counts.reporting, counts.stale) == (9, 7, 4, 3)
        assert [r.rank for r in liveness.stalest(session, job_id, 0, cutoff, 2)] == [6, 5]
        assert sorted(liveness.ranks_below(session, job_id, 8)) == list(range(7))
        assert sorted(r.rank for r in liveness.ranks_named(session, job_id, [2, 7, 9])) == [2, 9]
        assert nodes.count(session, job_id, 0) == 5
        assert [n.node for n in nodes.needing_attention(session, job_id, 0, cutoff, 2)] == ["n1", "n3"]
        assert [n.node for n in nodes.needing_attention(session, job_id, 0, cutoff, 9)] == ["n1", "n3", "n4"]
