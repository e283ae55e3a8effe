"""`/v1/tokens`: admin tokens (trainer tokens are made with their job)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, status
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.deps import AdminDep, SessionDep
from api.models import tokens

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


@router.post(
    "",
    response_model=TokenCreated,
    status_code=status.HTTP_201_CREATED,
    responses=links(
        201, RevokeToken=link("DELETE", "/v1/tokens/{token_id}", "Revoke the token.", token_id="$response.body#/id")
    ),
)
def create_token(body: TokenIn, session: SessionDep, _: AdminDep) -> TokenCreated:
    row, token = tokens.create_admin(session, body.name)
    return TokenCreated.model_validate({**TokenOut.model_validate(row).model_dump(), "token": token})


@router.get("", response_model=list[TokenOut])
def list_tokens(session: SessionDep, _: AdminDep) -> list[TokenOut]:
    return [TokenOut.model_validate(t) for t in tokens.list_tokens(session)]


@router.delete("/{token_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404, 409))
def revoke_token(token_id: str, session: SessionDep, _: AdminDep) -> None:
    """Revoke a token (an admin's, or a job's trainer token). The last active admin token is refused with
    409: without it no admin could use the API; create another admin token first."""
    last = tokens.last_admin(session, token_id)
    if last is not None:
        raise ApiError(
            409,
            f"token {last.name!r} ({last.id}) is the last active admin token: revoking it would lock every admin "
            "out of the API; create another admin token first (POST /v1/tokens, or `ftplane token create`)",
            field="token_id",
        )
    if not tokens.revoke(session, token_id):
        raise ApiError(404, f"no active token with id {token_id!r}", field="token_id")
