"""`GET /v1/audit`: who changed what, when, from where, and how it ended."""

from __future__ import annotations

from fastapi import APIRouter, Query

from api import models
from api.core.authz import Role
from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.deps import MemberDep, SessionDep, authorize
from api.schemas.events import Instant
from api.schemas.projects import AuditOut, AuditPage

router = APIRouter(prefix="/v1/audit", tags=["audit"])


@router.get(
    "",
    response_model=AuditPage,
    responses={
        **responses(404),
        **links(200, NextPage=link("GET", "/v1/audit", "The next page.", cursor="$response.body#/next_cursor")),
    },
)
def list_audit(
    session: SessionDep,
    principal: MemberDep,
    since: Instant | None = None,
    actor: str | None = Query(default=None, max_length=300, description="A token's id or name, a JWT's subject."),
    project: str | None = Query(default=None, max_length=63),
    cursor: int = Query(default=0, ge=0, le=2**63 - 1, description="The next_cursor of the previous page."),
    limit: int = Query(default=100, ge=1, le=1000),
) -> AuditPage:
    """The audit log, oldest first: every project's and the cluster's for cluster admins; for a project's admins,
    that project's (`project`) or all of those they administer."""
    if project is not None:
        authorize(principal, project, Role.admin, f"project {project!r}", "project")
    visible = principal.projects(Role.admin)
    if visible is not None and not visible:
        raise ApiError(403, "the audit log needs the admin role in a project (or cluster-admin)")
    rows = models.audit.page(
        session, projects=visible, since=since, actor=actor, project=project, after_id=cursor, limit=limit + 1
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return AuditPage(
        items=[AuditOut.model_validate(r) for r in rows],
        next_cursor=str(rows[-1].id) if more and rows else None,
    )
