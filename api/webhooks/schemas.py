"""Shapes of the webhooks API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schemas.events import EventType
from api.schemas.spec import LabelKey, LabelValue, keys_match_pattern
from api.webhooks.messages import DEFAULT_EVENT_TYPES


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=2048, description="http(s) URL of the receiver.")
    event_types: list[EventType] = Field(
        default_factory=lambda: list(DEFAULT_EVENT_TYPES),
        min_length=1,
        max_length=len(EventType),
        description="Event types to deliver. Default: every restart rung, hang_detected, node_excluded "
        "and the job's end (succeeded, failed, cancelled).",
    )
    label_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Only jobs carrying every one of these labels (empty: every job).",
        json_schema_extra=keys_match_pattern,
    )
    format: Literal["standard", "slack"] = Field(
        default="standard",
        description="standard: the Standard Webhooks JSON body; slack: a Slack incoming-webhook message.",
    )

    @field_validator("event_types")
    @classmethod
    def _unique(cls, value: list[EventType]) -> list[EventType]:
        return list(dict.fromkeys(value))


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    url: str
    event_types: list[EventType]
    label_selector: dict[str, str]
    format: str
    active: bool
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (Standard Webhooks `whsec_...`). Shown once; store it now.")


class DeliveryOut(BaseModel):
    id: str = Field(description="The webhook-id header: stable across retries and redeliveries.")
    subscription_id: str
    event_id: int
    event_type: str
    job_id: str
    status: str = Field(description="pending | delivered | failed")
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_try_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None
