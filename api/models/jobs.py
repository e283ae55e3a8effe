"""Job rows: creation, look-up and listing with cursor pagination."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from api.core.security import new_id
from api.database.tables import Attempt, Job
from api.schemas.events import utcnow
from api.schemas.spec import JobSpec
from api.schemas.status import AttemptStatus, JobStatus


def create(session: Session, spec: JobSpec) -> Job:
    now = utcnow()
    job = Job(
        id=new_id(),
        name=spec.name,
        project=spec.project,
        backend=spec.backend,
        status=JobStatus.PENDING,
        spec=spec.model_dump(mode="json"),
        labels=dict(spec.labels),
        attempt=0,
        job_restarts=0,
        excluded_nodes=[],
        failure_steps=[],
        created_at=now,
        updated_at=now,
    )
    session.add(job)
    session.flush()  # the attempt row references the job
    session.add(Attempt(job_id=job.id, number=0, status=AttemptStatus.PENDING, created_at=now))
    session.flush()
    return job


def get(session: Session, job_id: str, *, for_update: bool = False, for_share: bool = False) -> Job | None:
    """The job's row; `for_update` locks it against every other locker, `for_share` only against writers of the
    row (PostgreSQL's FOR SHARE: many reports at once, none while the row changes)."""
    query = select(Job).where(Job.id == job_id)
    if for_update:
        query = query.with_for_update()
    elif for_share:
        query = query.with_for_update(read=True)
    return session.scalar(query)


def project_of(session: Session, job_id: str) -> str | None:
    """The job's project; None when there is no such job."""
    return session.scalar(select(Job.project).where(Job.id == job_id))


def attempt_row(session: Session, job_id: str, number: int) -> Attempt | None:
    return session.scalar(select(Attempt).where(Attempt.job_id == job_id, Attempt.number == number))


def attempts(session: Session, job_id: str) -> list[Attempt]:
    return list(session.scalars(select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)))


def encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError on a cursor this server did not make."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, job_id = json.loads(base64.urlsafe_b64decode(padded.encode()))
        return datetime.fromisoformat(created), str(job_id)
    except Exception as exc:  # any malformed input is the caller's error
        raise ValueError("cursor is not one this server returned") from exc


def page(
    session: Session,
    *,
    statuses: Sequence[str] = (),
    labels: dict[str, str] | None = None,
    cursor: str | None = None,
    limit: int = 50,
    projects: Sequence[str] | None = None,
) -> tuple[list[Job], str | None]:
    """Newest first, of these `projects` (None: every project). Label filtering is exact-match on every given
    label."""
    query = select(Job)
    if projects is not None:
        query = query.where(Job.project.in_(list(projects)))
    if statuses:
        query = query.where(Job.status.in_(list(statuses)))
    if cursor:
        created, job_id = decode_cursor(cursor)
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    query = query.order_by(Job.created_at.desc(), Job.id.desc())
    wanted = labels or {}
    found: list[Job] = []
    # Labels are JSON; filter in Python over bounded windows so SQLite and PostgreSQL behave alike.
    offset = 0
    window = max(limit * 4, 200)
    while len(found) <= limit:
        batch = list(session.scalars(query.offset(offset).limit(window)))
        found.extend(j for j in batch if all(j.labels.get(k) == v for k, v in wanted.items()))
        if len(batch) < window:
            break
        offset += window
    items = found[:limit]
    next_cursor = encode_cursor(items[-1]) if len(found) > limit else None
    return items, next_cursor


def active(session: Session, statuses: Sequence[str]) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.status.in_(list(statuses))).order_by(Job.created_at)))


# ---- what each supervision duty works on (ids only: a duty locks and reads each job on its own) ----------


def ids(session: Session, query: Select[Any]) -> list[str]:
    return list(session.scalars(query.order_by(Job.created_at)))


def to_launch(session: Session, submitted_before: datetime) -> list[str]:
    """PENDING jobs whose submit task has not run by now, and active jobs whose current attempt is not launched."""
    unlaunched = select(Attempt.job_id).where(
        Attempt.job_id == Job.id, Attempt.number == Job.attempt, Attempt.status == AttemptStatus.PENDING
    )
    return ids(
        session,
        select(Job.id).where(
            ~Job.cancel_requested,
            or_(
                and_(Job.status == JobStatus.PENDING, Job.created_at < submitted_before),
                and_(Job.status.in_(_ACTIVE), unlaunched.exists()),
            ),
        ),
    )


def with_current_attempt_in(session: Session, statuses: Sequence[str]) -> list[str]:
    """Active jobs, not being cancelled, whose current attempt has one of `statuses`."""
    current = select(Attempt.job_id).where(
        Attempt.job_id == Job.id, Attempt.number == Job.attempt, Attempt.status.in_(list(statuses))
    )
    return ids(session, select(Job.id).where(Job.status.in_(_ACTIVE), ~Job.cancel_requested, current.exists()))


def to_cancel(session: Session) -> list[str]:
    return ids(session, select(Job.id).where(Job.cancel_requested, Job.status.in_(_ACTIVE)))


def to_release(session: Session) -> list[str]:
    return ids(session, select(Job.id).where(Job.status.in_(_TERMINAL), Job.released_at.is_(None)))


_ACTIVE = [JobStatus.SUBMITTED.value, JobStatus.RUNNING.value, JobStatus.RECOVERING.value]
_TERMINAL = [JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value]
