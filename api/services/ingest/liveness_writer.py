"""Node reports' liveness, coalesced in memory and written in one transaction about every 100 ms per process.

Liveness is soft state: each report supersedes the one before it, so only the newest node row and
the newest heartbeat per rank need to reach the database. The entry point (node_report.py) hands
them here and the route answers at once; a thread writes what is pending every
`FTPLANE_LIVENESS_FLUSH_S` (one upsert statement for all nodes, one for all ranks, whatever the
number of reports). The guarantee: an acknowledged heartbeat is stored within that period, or lost
with this process (the node's next report, a second later, stands for it). Events never come through here: a report that
carries events is stored in its own transaction before it is acknowledged.

While a write fails (the database is away), what is pending is kept (newest wins) and
`healthy` is False, so the entry point answers 503 and the agents back off, as on every other route.
Reads that must see this process's own reports call `flush()` first.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from api.core.config import get_settings
from api.core.db import get_sessionmaker
from api.models.liveness import rank_row, write_ranks
from api.models.nodes import node_row, write_nodes
from api.schemas.events import utcnow
from api.schemas.reports import NodeReport

log = logging.getLogger(__name__)
DEADLOCK_DETECTED = "40P01"  # PostgreSQL's SQLSTATE


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

    # ---- the entry point's side ----

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
                self._write(pending)
            except Exception:
                self.healthy = False
                with self._lock:  # put back what failed, unless something newer came meanwhile
                    for key, row in pending.nodes.items():
                        self._pending.nodes.setdefault(key, row)
                    for rank_key, rank in pending.ranks.items():
                        self._pending.ranks.setdefault(rank_key, rank)
                raise
            self.healthy = True

    def _write(self, pending: _Pending) -> None:
        # Rows are taken in key order by every writer; a deadlock can still come from a writer that does not (an
        # older process during an upgrade): the database then aborted this transaction, so write it again once.
        for last_try in (False, True):
            try:
                with self.database() as session, session.begin():
                    write_nodes(session, list(pending.nodes.values()))
                    write_ranks(session, list(pending.ranks.values()))
                return
            except OperationalError as exc:
                if last_try or getattr(exc.orig, "sqlstate", None) != DEADLOCK_DETECTED:
                    raise
                log.info("writing node liveness met a deadlock; writing it again")

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
