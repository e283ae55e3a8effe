"""API tokens: a role in one project, cluster-admin, or a trainer token scoped to one job."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.core.authz import CLUSTER_ADMIN, TRAINER, Principal, Role
from api.core.security import ADMIN_PREFIX, TRAINER_PREFIX, digest, new_id, new_token
from api.database.tables import ApiToken, Job
from api.schemas.events import utcnow

PROJECT_PREFIX = "ftp_"


def create(session: Session, name: str, *, project: str | None, role: Role | None) -> tuple[ApiToken, str]:
    """A token with `role` in `project`, or (both None) a cluster admin's."""
    if (project is None) != (role is None):
        raise ValueError("a token has both a project and a role, or neither (cluster-admin)")
    token = new_token(ADMIN_PREFIX if role is None else f"{PROJECT_PREFIX}{role.value}_")
    row = ApiToken(
        id=new_id(),
        name=name,
        digest=digest(token),
        role=CLUSTER_ADMIN if role is None else role.value,
        project=project,
    )
    session.add(row)
    session.flush()
    return row, token


def create_admin(session: Session, name: str) -> tuple[ApiToken, str]:
    """A cluster admin's token (every project, the fleet, the projects themselves)."""
    return create(session, name, project=None, role=None)


def create_trainer(session: Session, job_id: str, name: str = "trainer") -> tuple[ApiToken, str]:
    token = new_token(TRAINER_PREFIX)
    row = ApiToken(id=new_id(), name=name, digest=digest(token), role=TRAINER, job_id=job_id)
    session.add(row)
    session.flush()
    return row, token


def principal_of(row: ApiToken) -> Principal:
    if row.role == TRAINER:
        return Principal(token_id=row.id, kind="trainer", name=row.name, job_id=row.job_id)
    if row.role == CLUSTER_ADMIN:
        return Principal(token_id=row.id, kind="token", name=row.name, cluster_admin=True)
    roles = {row.project: Role(row.role)} if row.project else {}
    return Principal(token_id=row.id, kind="token", name=row.name, roles=roles)


def authenticate(session: Session, token: str) -> Principal | None:
    row = session.scalar(select(ApiToken).where(ApiToken.digest == digest(token), ApiToken.revoked_at.is_(None)))
    return principal_of(row) if row is not None else None


def list_tokens(session: Session, projects: list[str] | None = None) -> list[ApiToken]:
    """Every token (`projects` None), or those of these projects: theirs and their jobs' trainer tokens."""
    query = select(ApiToken).order_by(ApiToken.created_at)
    if projects is not None:
        jobs = select(Job.id).where(Job.project.in_(projects))
        query = query.where(ApiToken.project.in_(projects) | ApiToken.job_id.in_(jobs))
    return list(session.scalars(query))


def get(session: Session, token_id: str) -> ApiToken | None:
    return session.get(ApiToken, token_id)


def project_of(session: Session, row: ApiToken) -> str | None:
    """The project a token belongs to (a trainer token: its job's); None for a cluster admin's."""
    if row.job_id is not None:
        return session.scalar(select(Job.project).where(Job.id == row.job_id))
    return row.project


def last_admin(session: Session, token_id: str) -> ApiToken | None:
    """The token, if it is the only active cluster-admin token (revoking it would lock every cluster admin out).

    Every active cluster-admin token is locked while this transaction lasts, so two revocations at once cannot
    each see the other's token still active and both go through."""
    query = (
        select(ApiToken)
        .where(ApiToken.role == CLUSTER_ADMIN, ApiToken.revoked_at.is_(None))
        .order_by(ApiToken.id)
        .with_for_update()
    )
    admins = list(session.scalars(query))
    return admins[0] if len(admins) == 1 and admins[0].id == token_id else None


def revoke(session: Session, token_id: str) -> bool:
    result = session.execute(
        update(ApiToken).where(ApiToken.id == token_id, ApiToken.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return bool(result.rowcount)  # type: ignore[attr-defined]


def revoke_job_tokens(session: Session, job_id: str) -> int:
    """A finished job's trainer tokens report nothing more."""
    result = session.execute(
        update(ApiToken).where(ApiToken.job_id == job_id, ApiToken.revoked_at.is_(None)).values(revoked_at=utcnow())
    )
    return int(result.rowcount)  # type: ignore[attr-defined]
