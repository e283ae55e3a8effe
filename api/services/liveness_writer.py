"""Node reports' liveness, coalesced in memory and written in one transaction about every 100 ms per process.

Liveness is soft state: each report supersedes the one before it, so only the newest node row and
the newest heartbeat per rank need to reach the database. The report route hands them here and
answers at once; a thread writes what is pending every `FTPLANE_LIVENESS_FLUSH_S` (one upsert
statement for all nodes, one for all ranks, whatever the number of reports). The guarantee:
an acknowledged heartbeat is stored within that period, or lost with this process (the node's
next report, a second later, stands for it). Events never come through here: a report that
carries events is stored in its own transaction before it is acknowledged.

While a write fails (the database is away), what is pending is kept (newest wins) and
`healthy` is False, so the route answers 503 and the agents back off, as on every other route.
Reads that must see this process's own reports call `flush()` first.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from api.core.config import get_settings
from api.core.db import get_sessionmaker
from api.database.tables import NodeLiveness, RankLiveness
from api.schemas.events import utcnow
from api.schemas.reports import NodeReport

log = logging.getLogger(__name__)

_RANK_COLUMNS = ("attempt", "node", "step", "last_seen", "throughput", "loss", "step_time_s", "compute_s", "perf_score")
_NODE_COLUMNS = ("attempt", "last_seen", "launcher_alive", "progress", "healthy", "unhealthy_reason", "ranks", "gpus")


@dataclass
class _Pending:
    nodes: dict[tuple[str, str], dict[str, Any]]
    ranks: dict[tuple[str, int], dict[str, Any]]


class LivenessWriter:
    def __init__(self, period_s: float, database: sessionmaker[Session] | None = None) -> None:
        self.period_s = period_s
        self.database = database or get_sessionmaker()  # the database of the settings it was made with
        self.healthy = True
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._pending = _Pending({}, {})
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the route's side ----

    def add(self, job_id: str, report: NodeReport) -> int:
        """Keep the report's liveness for the next write; returns the heartbeats accepted."""
        now = utcnow()
        node = node_row(job_id, report, now)
        with self._lock:
            held = self._pending.nodes.get((job_id, report.node))
            if held is None or held["attempt"] <= node["attempt"]:
                self._pending.nodes[(job_id, report.node)] = node
            for beat in report.heartbeats:
                row = rank_row(job_id, report.attempt, beat, now)
                key = (job_id, beat.rank)
                held = self._pending.ranks.get(key)
                if held is None or (held["attempt"], held["last_seen"]) <= (row["attempt"], row["last_seen"]):
                    self._pending.ranks[key] = row
        if self.period_s <= 0:
            self.flush()
        else:
            self._ensure_thread()
        return len(report.heartbeats)

    # ---- writing ----

    def flush(self) -> None:
        """Write what is pending now (raises when the database fails; what was pending is kept)."""
        with self._write_lock:
            with self._lock:
                pending, self._pending = self._pending, _Pending({}, {})
            if not pending.nodes and not pending.ranks:
                return
            try:
                with self.database() as session, session.begin():
                    write_nodes(session, list(pending.nodes.values()))
                    write_ranks(session, list(pending.ranks.values()))
            except Exception:
                self.healthy = False
                with self._lock:  # put back what failed, unless something newer came meanwhile
                    for key, row in pending.nodes.items():
                        self._pending.nodes.setdefault(key, row)
                    for rank_key, rank in pending.ranks.items():
                        self._pending.ranks.setdefault(rank_key, rank)
                raise
            self.healthy = True

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            with self._write_lock:
                if self._thread is None or not self._thread.is_alive():
                    self._thread = threading.Thread(target=self._run, name="ftplane-liveness-writer", daemon=True)
                    self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.wait(self.period_s):
            try:
                self.flush()
            except Exception:
                log.warning("writing node liveness failed; kept for the next try", exc_info=True)
                time.sleep(min(5.0, self.period_s * 10))


def node_row(job_id: str, report: NodeReport, now: datetime) -> dict[str, Any]:
    status = report.agent
    return {
        "job_id": job_id,
        "node": report.node,
        "attempt": report.attempt,
        "last_seen": now,
        "launcher_alive": status.launcher.alive if status.launcher else True,
        "progress": status.progress,
        "healthy": status.healthy,
        "unhealthy_reason": status.unhealthy_reason,
        "ranks": [r.model_dump(exclude_none=True) for r in status.ranks],
        "gpus": [g.model_dump(exclude_none=True) for g in status.gpus],
    }


def rank_row(job_id: str, attempt: int, beat: Any, now: datetime) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "rank": beat.rank,
        "attempt": attempt,
        "node": beat.node,
        "step": beat.step,
        "last_seen": min(beat.ts or now, now),  # a skewed clock can't make a rank look alive in the future
        "throughput": beat.throughput,
        "loss": beat.loss,
        "step_time_s": beat.step_time_s,
        "compute_s": beat.compute_s,
        "perf_score": beat.perf_score,
    }


def _upsert(dialect: str, table: Any, keys: list[str], columns: tuple[str, ...], newer: Any) -> Any:
    """One INSERT ... ON CONFLICT DO UPDATE for a whole list of rows (executemany: compiled once, then cached)."""
    stmt = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)
    return stmt.on_conflict_do_update(
        index_elements=keys, set_={c: stmt.excluded[c] for c in columns}, where=newer(table.c, stmt.excluded)
    )


@cache
def _node_upsert(dialect: str) -> Any:
    return _upsert(
        dialect, NodeLiveness.__table__, ["job_id", "node"], _NODE_COLUMNS, lambda old, new: old.attempt <= new.attempt
    )


@cache
def _rank_upsert(dialect: str) -> Any:
    return _upsert(
        dialect,
        RankLiveness.__table__,
        ["job_id", "rank"],
        _RANK_COLUMNS,
        lambda old, new: (
            (old.attempt < new.attempt) | ((old.attempt == new.attempt) & (old.last_seen <= new.last_seen))
        ),
    )


def write_nodes(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert node rows; a report of an older attempt never overwrites a newer one."""
    if rows:
        connection = session.connection()
        connection.execute(_node_upsert(connection.dialect.name), rows)


# PostgreSQL: the rows travel as one JSON array, whatever their number (one parse, no bound parameter per value).
_UPSERT_RANKS_POSTGRESQL = text(
    """
    INSERT INTO rank_liveness (job_id, rank, attempt, node, step, last_seen, throughput, loss, step_time_s,
                               compute_s, perf_score)
    SELECT u.job_id, u.rank, u.attempt, u.node, u.step, u.last_seen, u.throughput, u.loss, u.step_time_s,
           u.compute_s, u.perf_score
    FROM jsonb_to_recordset(CAST(:rows AS jsonb))
        AS u(job_id varchar, rank integer, attempt integer, node varchar, step bigint, last_seen timestamptz,
             throughput float8, loss float8, step_time_s float8, compute_s float8, perf_score float8)
    ORDER BY u.job_id, u.rank
    ON CONFLICT (job_id, rank) DO UPDATE SET
        attempt = excluded.attempt, node = excluded.node, step = excluded.step,
        last_seen = excluded.last_seen, throughput = excluded.throughput, loss = excluded.loss,
        step_time_s = excluded.step_time_s, compute_s = excluded.compute_s, perf_score = excluded.perf_score
    WHERE rank_liveness.attempt < excluded.attempt
       OR (rank_liveness.attempt = excluded.attempt AND rank_liveness.last_seen <= excluded.last_seen)
    """
)


def write_ranks(session: Session, rows: list[dict[str, Any]]) -> None:
    """Upsert rank rows (newest heartbeat wins, also against rows other processes wrote)."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        payload = [{**row, "last_seen": row["last_seen"].isoformat()} for row in rows]
        session.execute(_UPSERT_RANKS_POSTGRESQL, {"rows": json.dumps(payload)})
        return
    session.connection().execute(_rank_upsert("sqlite"), rows)


_writer: LivenessWriter | None = None
_writer_lock = threading.Lock()


def writer() -> LivenessWriter:
    """This process's writer, for the current settings."""
    global _writer
    period = get_settings().liveness_flush_s
    with _writer_lock:
        if _writer is None or _writer.period_s != period:
            _writer = LivenessWriter(period)
        return _writer


def flush() -> None:
    """Make this process's reports visible to its own reads (a no-op when nothing is pending)."""
    if _writer is not None:
        _writer.flush()


def reset() -> None:
    """Write what is pending and start over (a new app: tests switch databases between cases)."""
    global _writer
    with _writer_lock:
        old, _writer = _writer, None
    if old is not None:
        try:
            old.flush()
        except Exception:
            log.warning("liveness pending at reset was lost", exc_info=True)
        old.stop()
