"""The audit log's rows: added to the session of the change they record, read back newest last by id."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.database.tables import AuditEntry


def add(session: Session, entry: AuditEntry) -> AuditEntry:
    session.add(entry)
    return entry


def page(
    session: Session,
    *,
    projects: list[str] | None,
    since: datetime | None = None,
    actor: str | None = None,
    project: str | None = None,
    after_id: int = 0,
    limit: int = 100,
) -> list[AuditEntry]:
    """Oldest first, after `after_id`. `projects` None: rows of every project and of none (cluster-wide changes);
    else only rows of these projects."""
    query: Any = select(AuditEntry).where(AuditEntry.id > after_id)
    if projects is not None:
        query = query.where(AuditEntry.project.in_(projects))
    if project is not None:
        query = query.where(AuditEntry.project == project)
    if since is not None:
        query = query.where(AuditEntry.ts >= since)
    if actor is not None:
        query = query.where((AuditEntry.actor == actor) | (AuditEntry.actor_name == actor))
    return list(session.scalars(query.order_by(AuditEntry.id).limit(limit)))
