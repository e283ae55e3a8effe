"""`/v1/tokens`: admin tokens (trainer tokens are made with their job)."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, status
from pydantic import BaseModel, ConfigDict, Field

from api.core.errors import ApiError, responses
from api.deps import AdminDep, SessionDep
from api.models import tokens

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=200)


class TokenOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    role: str
    job_id: str | None
    created_at: datetime
    revoked_at: datetime | None


class TokenCreated(TokenOut):
    token: str = Field(description="Shown once; only its digest is stored.")


@router.post("", response_model=TokenCreated, status_code=status.HTTP_201_CREATED)
def create_token(body: TokenIn, session: SessionDep, _: AdminDep) -> TokenCreated:
    row, token = tokens.create_admin(session, body.name)
    return TokenCreated.model_validate({**TokenOut.model_validate(row).model_dump(), "token": token})


@router.get("", response_model=list[TokenOut])
def list_tokens(session: SessionDep, _: AdminDep) -> list[TokenOut]:
    return [TokenOut.model_validate(t) for t in tokens.list_tokens(session)]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404))
def revoke_token(token_id: str, session: SessionDep, _: AdminDep) -> None:
    if not tokens.revoke(session, token_id):
        raise ApiError(404, f"no active token with id {token_id!r}", field="token_id")
