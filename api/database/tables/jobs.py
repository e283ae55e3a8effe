"""The control plane's own tables: projects, jobs, attempts, events, liveness, tokens, webhooks."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
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


class Project(Base):
    """Who may see and act on jobs, webhooks and tokens is decided per project (api/core/authz.py)."""

    __tablename__ = "projects"

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    # At most this many GPUs (spec GPUs per node x nodes) of the project's jobs admitted at once; None: no limit.
    gpu_limit: Mapped[int | None] = mapped_column(Integer, default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class RoleBinding(Base):
    """A role in a project for the callers whose JWT carries this group (`kind` group) or subject (`kind` subject)."""

    __tablename__ = "role_bindings"
    __table_args__ = (UniqueConstraint("project", "kind", "value", name="uq_role_bindings_project_kind_value"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # group | subject
    value: Mapped[str] = mapped_column(String(256), index=True)
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class AuditEntry(Base):
    """One request that changed something, or tried to: written in the same transaction as the change."""

    __tablename__ = "audit_log"
    __table_args__ = (
        Index("ix_audit_log_project_id", "project", "id"),
        Index("ix_audit_log_actor_id", "actor", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(300))  # a token's id, jwt:<issuer>#<subject>, or host:<user>@<machine>
    actor_kind: Mapped[str] = mapped_column(String(16))  # token | jwt | anonymous | host
    actor_name: Mapped[str] = mapped_column(String(300))  # the token's name, or the JWT's subject
    issuer: Mapped[str | None] = mapped_column(String(300), default=None)
    action: Mapped[str] = mapped_column(String(120))  # METHOD /route/{template}
    object_type: Mapped[str] = mapped_column(String(32))
    object_id: Mapped[str | None] = mapped_column(String(253), default=None)
    project: Mapped[str | None] = mapped_column(String(63), default=None)
    address: Mapped[str | None] = mapped_column(String(64), default=None)
    outcome: Mapped[int] = mapped_column(Integer)  # the HTTP status answered
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(63), index=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"), index=True, default="default")
    backend: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), index=True)
    spec: Mapped[dict[str, Any]]
    labels: Mapped[dict[str, Any]]
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    job_restarts: Mapped[int] = mapped_column(Integer, default=0)
    status_reason: Mapped[str | None] = mapped_column(Text, default=None)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    excluded_nodes: Mapped[list[Any]] = mapped_column(default=list)
    # Highest step reached before each restart, in order: a run that never gets past it is stuck.
    failure_steps: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # When an ended job's leftovers (processes, pods, Secrets, tokens) were released.
    released_at: Mapped[datetime | None] = mapped_column(default=None)
    # The steps the job will run, when its ranks say (progress and ETA).
    total_steps: Mapped[int | None] = mapped_column(BigInteger, default=None)
    # When its project's GPU limit let it launch (api/services/quotas.py); it counts against the limit until it ends.
    admitted_at: Mapped[datetime | None] = mapped_column(default=None)


class Attempt(Base):
    __tablename__ = "attempts"
    __table_args__ = (UniqueConstraint("job_id", "number", name="uq_attempts_job_number"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str | None] = mapped_column(Text, default=None)
    in_job_restarts: Mapped[int] = mapped_column(Integer, default=0)
    max_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    launched_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("job_id", "key", name="uq_events_job_key"),
        Index("ix_events_job_ts", "job_id", "ts"),
        Index("ix_events_job_type", "job_id", "type"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    rank: Mapped[int | None] = mapped_column(Integer, default=None)
    node: Mapped[str | None] = mapped_column(String(253), default=None)
    step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    key: Mapped[str] = mapped_column(String(200))


class RankLiveness(Base):
    """Latest heartbeat per (job, rank): overwritten in place, never appended."""

    __tablename__ = "rank_liveness"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(String(253), default=None)
    step: Mapped[int] = mapped_column(BigInteger)
    last_seen: Mapped[datetime]
    throughput: Mapped[float | None] = mapped_column(Float, default=None)
    loss: Mapped[float | None] = mapped_column(Float, default=None)
    step_time_s: Mapped[float | None] = mapped_column(Float, default=None)
    compute_s: Mapped[float | None] = mapped_column(Float, default=None)  # the rank's own work in its last step
    perf_score: Mapped[float | None] = mapped_column(Float, default=None)  # NVRx straggler detection's score


class NodeLiveness(Base):
    """Latest report of each node's agent per (job, node): overwritten in place, never appended."""

    __tablename__ = "node_liveness"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[str] = mapped_column(String(253), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    last_seen: Mapped[datetime]
    launcher_alive: Mapped[bool] = mapped_column(Boolean, default=True)
    # sdk: ranks report through the SDK; log: steps read from the ranks' output; none: processes only
    progress: Mapped[str] = mapped_column(String(8), default="none")
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    unhealthy_reason: Mapped[str | None] = mapped_column(Text, default=None)
    # [{rank, local_rank, pid, alive, exit_code?, signal?}] and [{index, xid_errors, ecc_uncorrected, throttled}]
    ranks: Mapped[list[Any]] = mapped_column(default=list)
    gpus: Mapped[list[Any]] = mapped_column(default=list)


class ApiToken(Base):
    """Bearer tokens, stored as SHA-256 digests: a role in one project, cluster-admin (no project), or a trainer
    token for one job (`job_id`)."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # viewer | operator | admin | cluster-admin | trainer
    project: Mapped[str | None] = mapped_column(ForeignKey("projects.name"), default=None, index=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), default=None, index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class PendingFault(Base):
    """The fault outbox: every requested fault, until it is delivered to whoever injects it (`delivery`)."""

    __tablename__ = "pending_faults"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))
    rank: Mapped[int] = mapped_column(Integer)
    at_step: Mapped[int | None] = mapped_column(BigInteger, default=None)
    fraction: Mapped[float | None] = mapped_column(Float, default=None)  # slowdown: of the step time, slept
    duration_steps: Mapped[int | None] = mapped_column(BigInteger, default=None)  # slowdown: for this many steps
    delivery: Mapped[str] = mapped_column(String(16))  # api.models.faults.Delivery
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)


class JobWatch(Base):
    """What the watching duties carry from one pass to the next for a job (soft state, rebuilt if lost): the
    straggler window's passes and open episodes, the restart anomalies' open episodes."""

    __tablename__ = "job_watch"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    stragglers: Mapped[dict[str, Any]] = mapped_column(default=dict)
    open_stragglers: Mapped[int] = mapped_column(Integer, default=0, index=True)  # episodes open now
    anomalies: Mapped[dict[str, Any]] = mapped_column(default=dict)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class StragglerSample(Base):
    """A rank found below the straggler threshold in one pass (only those: a healthy pass writes nothing)."""

    __tablename__ = "straggler_samples"
    __table_args__ = (Index("ix_straggler_samples_job_ts", "job_id", "ts"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    ts: Mapped[datetime]
    score: Mapped[float] = mapped_column(Float)
    pace_s: Mapped[float] = mapped_column(Float)
    reference_s: Mapped[float] = mapped_column(Float)


class WebhookSubscription(Base):
    __tablename__ = "webhook_subscriptions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    project: Mapped[str] = mapped_column(ForeignKey("projects.name"), index=True, default="default")
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[Any]] = mapped_column(default=list)
    label_selector: Mapped[dict[str, Any]] = mapped_column(default=dict)
    format: Mapped[str] = mapped_column(String(16), default="standard")
    secret: Mapped[str] = mapped_column(String(128))  # needed to sign, so kept (never listed)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("subscription_id", "event_id", name="uq_delivery_subscription_event"),
        Index("ix_webhook_deliveries_due", "status", "next_try_at"),
    )

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # the stable webhook-id
    subscription_id: Mapped[str] = mapped_column(ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"), index=True)
    # None for what no job's event says (an objective's breach: its payload is all there is)
    event_id: Mapped[int | None] = mapped_column(ForeignKey("events.id", ondelete="CASCADE"), default=None)
    job_id: Mapped[str | None] = mapped_column(String(32), index=True, default=None)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_status_code: Mapped[int | None] = mapped_column(Integer, default=None)
    last_error: Mapped[str | None] = mapped_column(Text, default=None)
    next_try_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(default=None)
    # The message as it was when the event was stored (outbox): every retry sends the same content.
    payload: Mapped[dict[str, Any] | None] = mapped_column(default=None)
