"""`/v1/tokens`: tokens with a role in one project, and cluster admins' (trainer tokens are made with their job).

A project's admins make, list and revoke its tokens (and its jobs' trainer tokens); cluster admins all of them.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Request, status
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from api import models
from api.core.authz import CLUSTER_ADMIN, Role
from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.deps import AuditDep, MemberDep, SessionDep, authorize, project_for, require_cluster_admin
from api.schemas.spec import DNS_LABEL

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


# A name is shown to people: no control characters and no invisible or direction-changing
# formatting characters (a right-to-left override can make a name read as another).
UNPRINTABLE = "\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff"
_UNPRINTABLE = re.compile(f"[{UNPRINTABLE}]")


def _printable(name: str) -> str:
    found = _UNPRINTABLE.search(name)
    if found:
        raise ValueError(f"character U+{ord(found.group()):04X} is a control or formatting character: remove it")
    return name


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[
        str,
        Field(min_length=1, max_length=200, json_schema_extra={"pattern": f"^[^{UNPRINTABLE}]+$"}),
        AfterValidator(_printable),
    ]
    project: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The project the token acts in (its admins may make it); absent: a cluster admin's token.",
    )
    role: Literal["viewer", "operator", "admin", "cluster-admin"] | None = Field(
        default=None,
        description="The token's role in `project` (default viewer); cluster-admin (only without a project, and "
        "only by a cluster admin) for every project. A project given with cluster-admin is refused with 422.",
    )


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    role: str
    project: str | None
    job_id: str | None
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="Shown once; only its digest is stored.")


@router.post(
    "",
    response_model=TokenCreated,
    status_code=status.HTTP_201_CREATED,
    responses=links(
        201, RevokeToken=link("DELETE", "/v1/tokens/{token_id}", "Revoke the token.", token_id="$response.body#/id")
    ),
)
def create_token(
    body: TokenIn, request: Request, session: SessionDep, principal: MemberDep, audit: AuditDep
) -> TokenCreated:
    """Make a token. With a `project`: a role in it (viewer by default), by an admin of the project. Without:
    a cluster admin's token, by a cluster admin."""
    if body.project is None:
        if body.role not in (None, CLUSTER_ADMIN):
            raise ApiError(422, f"a {body.role} token needs a project: give `project`", field="project")
        require_cluster_admin(principal)
        row, token = models.tokens.create(session, body.name, project=None, role=None)
    else:
        if body.role == CLUSTER_ADMIN:
            raise ApiError(422, "a cluster-admin token has no project: leave `project` out", field="role")
        project_for(session, request, principal, body.project, Role.admin)
        row, token = models.tokens.create(session, body.name, project=body.project, role=Role(body.role or "viewer"))
    if audit is not None:
        audit.about(object_id=row.id, role=row.role)
    return TokenCreated.model_validate({**TokenOut.model_validate(row).model_dump(), "token": token})


@router.get("", response_model=list[TokenOut])
def list_tokens(session: SessionDep, principal: MemberDep) -> list[TokenOut]:
    """The tokens of the projects the caller is an admin of (every token, for a cluster admin)."""
    projects = principal.projects(Role.admin)
    return [TokenOut.model_validate(t) for t in models.tokens.list_tokens(session, projects)]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404, 409))
def revoke_token(token_id: str, session: SessionDep, principal: MemberDep, audit: AuditDep) -> None:
    """Revoke a token (a project's, a job's trainer token, or a cluster admin's). The last active cluster-admin
    token is refused with 409: without it no one could manage projects; create another one first."""
    row = models.tokens.get(session, token_id)
    project = models.tokens.project_of(session, row) if row is not None else None
    what = f"active token with id {token_id!r}"
    if row is None:
        raise ApiError(404, f"no {what}", field="token_id")
    if audit is not None and project is not None:
        audit.about(project=project)
    if project is None:
        if not principal.cluster_admin:
            raise ApiError(404, f"no {what}", field="token_id")
    else:
        authorize(principal, project, Role.admin, what, "token_id")
    last = models.tokens.last_admin(session, token_id)
    if last is not None:
        raise ApiError(
            409,
            f"token {last.name!r} ({last.id}) is the last active cluster-admin token: revoking it would lock every "
            "cluster admin out of the API; create another one first (POST /v1/tokens, or `ftplane token create`)",
            field="token_id",
        )
    if not models.tokens.revoke(session, token_id):
        raise ApiError(404, f"no {what}", field="token_id")
