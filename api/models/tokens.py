"""API tokens: admin tokens for people and tools, trainer tokens scoped to one job."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.core.security import ADMIN_PREFIX, TRAINER_PREFIX, digest, new_id, new_token
from api.database.tables import ApiToken
from api.schemas.events import utcnow


@dataclass(frozen=True)
class Principal:
    """Who is calling: an admin, or the trainer of one job."""

    token_id: str
    role: str  # admin | trainer
    job_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


def create_admin(session: Session, name: str) -> tuple[ApiToken, str]:
    token = new_token(ADMIN_PREFIX)
    row = ApiToken(id=new_id(), name=name, digest=digest(token), role="admin")
    session.add(row)
    session.flush()
    return row, token


def create_trainer(session: Session, job_id: str, name: str = "trainer") -> tuple[ApiToken, str]:
    token = new_token(TRAINER_PREFIX)
    row = ApiToken(id=new_id(), name=name, digest=digest(token), role="trainer", job_id=job_id)
    session.add(row)
    session.flush()
    return row, token


def authenticate(session: Session, token: str) -> Principal | None:
    row = session.scalar(select(ApiToken).where(ApiToken.digest == digest(token), ApiToken.revoked_at.is_(None)))
    if row is None:
        return None
    return Principal(token_id=row.id, role=row.role, job_id=row.job_id)


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(select(ApiToken).order_by(ApiToken.created_at)))


def last_admin(session: Session, token_id: str) -> ApiToken | None:
    """The token, if it is the only active admin token (revoking it would lock every admin out of the API).

    Every active admin token is locked while this transaction lasts, so two revocations at once cannot each
    see the other's token still active and both go through."""
    query = select(ApiToken).where(ApiToken.role == "admin", ApiToken.revoked_at.is_(None)).order_by(ApiToken.id)
    admins = list(session.scalars(query.with_for_update()))
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
