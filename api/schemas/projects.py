"""Shapes of the projects, role bindings and audit log APIs."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.schemas.scalars import JsonInt
from api.schemas.spec import DnsLabel

GpuLimit = Annotated[int, JsonInt(ge=0, le=1_000_000)]

RoleName = Literal["viewer", "operator", "admin"]


class ProjectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: DnsLabel
    gpu_limit: GpuLimit | None = Field(
        default=None,
        description="At most this many GPUs (spec resources.gpus_per_node x nodes) of the project's jobs running "
        "at once; a job over it waits PENDING (a `queued` event says why). Absent: no limit.",
    )


class ProjectUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu_limit: GpuLimit | None = Field(description="The new GPU limit; null: no limit.")


class ProjectOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    gpu_limit: int | None
    created_at: datetime


class BindingIn(BaseModel):
    """Exactly one of `group` (a value of the JWT's groups claim) or `subject` (its `sub`)."""

    model_config = ConfigDict(extra="forbid")

    group: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[\x21-\x7e][\x20-\x7e]*$")
    subject: str | None = Field(default=None, min_length=1, max_length=256, pattern=r"^[\x21-\x7e][\x20-\x7e]*$")
    role: RoleName

    @model_validator(mode="after")
    def _one_of(self) -> BindingIn:
        if (self.group is None) == (self.subject is None):
            raise ValueError("give exactly one of group or subject")
        return self


class BindingOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    project: str
    kind: Literal["group", "subject"]
    value: str
    role: RoleName
    created_at: datetime


class AuditOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    ts: datetime
    actor: str = Field(
        description="The token's id, jwt:<issuer>#<subject>, or host:<user>@<machine> for a change made on a host "
        "with the database's credentials (`ftplane token create`)."
    )
    actor_kind: str = Field(description="token, jwt, anonymous or host.")
    actor_name: str = Field(description="The token's name, the JWT's subject, or the host's user.")
    issuer: str | None
    action: str = Field(description="METHOD and route, e.g. POST /v1/jobs/{job_id}/cancel.")
    object_type: str
    object_id: str | None
    project: str | None
    address: str | None
    outcome: int = Field(description="The HTTP status the request was answered with.")
    details: dict[str, Any]


class AuditPage(BaseModel):
    items: list[AuditOut]
    next_cursor: str | None
