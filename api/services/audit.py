"""The audit log: every request that changes something (or tries to), with who, what, which object, when, from
which address and the outcome.

A changing request's row is added to the request's own session before the route runs (`begin`), so it is
committed with the change or not at all: a change is never kept without its row. The route may say more
about the object (`AuditTrail.about`: a new job's id, the project). A request refused after its caller was
known (403, 404, 409, 422, ...) rolls its session back; `record_refusal` then writes its row, with that
outcome, in a transaction of its own.

Audited: POST, PUT, PATCH and DELETE on every /v1 router that `api/main.py` includes with the audit
dependency (all but the node reports, which are the nodes' own traffic, not people's changes), and the changes
made on a host with the database's credentials, without the API (`host_change`: `ftplane token create`).
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from typing import Any

from fastapi import Request
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from api import models
from api.core.authz import Principal
from api.core.db import session_scope
from api.database.tables import AuditEntry
from api.schemas.events import utcnow

log = logging.getLogger(__name__)

CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# The collections a path names, and what the audit log calls one of their objects.
OBJECT_TYPES = {
    "jobs": "job",
    "tokens": "token",
    "webhooks": "webhook",
    "deliveries": "delivery",
    "projects": "project",
    "bindings": "binding",
    "nodes": "node",
}


class AuditTrail:
    """The audit row of one changing request, in the request's session."""

    def __init__(self, session: Session, entry: AuditEntry) -> None:
        self.session = session
        self.entry = entry

    def about(
        self, object_type: str | None = None, object_id: str | None = None, project: str | None = None, **details: Any
    ) -> None:
        if object_type is not None:
            self.entry.object_type = object_type
        if object_id is not None:
            self.entry.object_id = object_id
        if project is not None:
            self.entry.project = project
        if details:
            self.entry.details = {**(self.entry.details or {}), **details}


def begin(request: Request, session: Session, principal: Principal) -> AuditTrail | None:
    """The trail of a changing request (its row added to `session`), or None for a read."""
    if request.method not in CHANGING:
        return None
    route = request.scope.get("route")
    template = getattr(route, "path", request.url.path)
    object_type, object_id = _object(template, request.path_params)
    entry = AuditEntry(
        ts=utcnow(),
        actor=principal.token_id,
        actor_kind=principal.kind,
        actor_name=(principal.subject or principal.name or principal.kind)[:300],
        issuer=principal.issuer,
        action=f"{request.method} {template}"[:120],
        object_type=object_type,
        object_id=object_id,
        project=None,
        address=(request.client.host if request.client else None),
        outcome=getattr(route, "status_code", None) or 200,
        details={},
    )
    models.audit.add(session, entry)
    trail = AuditTrail(session, entry)
    request.state.audit = trail
    return trail


def host_change(
    session: Session, action: str, object_type: str, object_id: str, project: str | None, **details: Any
) -> AuditEntry:
    """The row of a creation made on this host straight to the database (no token: the actor is the host's user),
    in the change's own session; its outcome is what the API answers a creation."""
    user = _host_user()
    machine = socket.gethostname()
    entry = AuditEntry(
        ts=utcnow(),
        actor=f"host:{user}@{machine}"[:300],
        actor_kind="host",
        actor_name=user[:300],
        issuer=None,
        action=action[:120],
        object_type=object_type,
        object_id=object_id,
        project=project,
        address=None,
        outcome=201,
        details=details,
    )
    return models.audit.add(session, entry)


def _host_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no USER
        return f"uid-{os.getuid()}"


def _object(template: str, params: dict[str, Any]) -> tuple[str, str | None]:
    """The object a route acts on: the last resource its path names, and the id given for it."""
    object_type, object_id = "request", None
    for segment in template.split("/"):
        if segment.startswith("{"):
            object_id = str(params.get(segment.strip("{}"), ""))[:253] or None
        elif segment in OBJECT_TYPES:
            object_type, object_id = OBJECT_TYPES[segment], None
    return object_type, object_id


def record_refusal(request: Request, status: int, message: str) -> None:
    """Write the row of a changing request that was refused, in a transaction of its own (its session was
    rolled back). Requests whose caller was never known (401) have no trail and no row."""
    trail: AuditTrail | None = getattr(request.state, "audit", None)
    if trail is None:
        return
    draft = trail.entry
    row = AuditEntry(
        ts=draft.ts,
        actor=draft.actor,
        actor_kind=draft.actor_kind,
        actor_name=draft.actor_name,
        issuer=draft.issuer,
        action=draft.action,
        object_type=draft.object_type,
        object_id=draft.object_id,
        project=draft.project,
        address=draft.address,
        outcome=status,
        details={**(draft.details or {}), "refused": message[:500]},
    )
    request.state.audit = None
    try:
        with session_scope() as session:
            models.audit.add(session, row)
    except SQLAlchemyError as exc:  # the refusal changed nothing; its answer still goes out (the database is down)
        log.warning("audit row of a refused %s not written: %s", draft.action, type(exc).__name__)
