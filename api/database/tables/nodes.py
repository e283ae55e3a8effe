"""The fleet's nodes: reputation, blamed faults, history (api/services/node_reputation/)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from api.database.tables.base import Base, BigId
from api.schemas.events import utcnow


class FleetNode(Base):
    """Every node ftplane has run on, across jobs, and its state by the rule (node_reputation/rule.py)."""

    __tablename__ = "fleet_nodes"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), default="healthy", index=True)  # healthy | suspect | quarantined
    state_since: Mapped[datetime] = mapped_column(default=utcnow)
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    quarantined_until: Mapped[datetime | None] = mapped_column(default=None)
    # Faults at or before this are forgiven (a release): they no longer count towards the state.
    forgiven_before: Mapped[datetime | None] = mapped_column(default=None)
    quarantines: Mapped[int] = mapped_column(Integer, default=0)  # how many times quarantined (the latest's number)
    announced_job_id: Mapped[str | None] = mapped_column(String(32), default=None)  # the job its quarantine is told on
    first_seen: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)


class NodeFault(Base):
    """A fault blamed on a node: one per (job, attempt) failure of the node, one per straggler episode."""

    __tablename__ = "node_faults"
    __table_args__ = (
        UniqueConstraint("node", "key", name="uq_node_faults_node_key"),
        Index("ix_node_faults_node_ts", "node", "ts"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(ForeignKey("fleet_nodes.name", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(300))  # <job>:a<attempt>:failure, or ...:straggler:<episode>
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # api.schemas.fleet_nodes.FaultKind
    counted: Mapped[bool] = mapped_column(Boolean)
    ts: Mapped[datetime]
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    event_id: Mapped[int] = mapped_column(BigInteger)  # the event that says it


class NodeRun(Base):
    """An attempt of a job that ran on a node (seen in the events its node sent or that name it)."""

    __tablename__ = "node_runs"
    __table_args__ = (Index("ix_node_runs_node_last_seen", "node", "last_seen"),)

    node: Mapped[str] = mapped_column(ForeignKey("fleet_nodes.name", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True, index=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]


class NodeHistory(Base):
    """A node's changes of state, with why and by whom."""

    __tablename__ = "node_history"
    __table_args__ = (Index("ix_node_history_node_id", "node", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(ForeignKey("fleet_nodes.name", ondelete="CASCADE"))
    ts: Mapped[datetime] = mapped_column(default=utcnow)
    state: Mapped[str] = mapped_column(String(16))  # the state entered
    action: Mapped[str] = mapped_column(String(16))  # suspect | quarantined | released | healthy
    reason: Mapped[str | None] = mapped_column(Text, default=None)
    actor: Mapped[str] = mapped_column(String(300))  # ftplane (the rule), or the caller who released it
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class NodeLedgerCursor(Base):
    """How far the node ledger has read the (append-only) events: every event up to `position` is recorded."""

    __tablename__ = "node_ledger_cursor"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    position: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)
