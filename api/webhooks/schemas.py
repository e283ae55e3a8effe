"""Shapes of the webhooks API."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from api.schemas.events import EventType
from api.schemas.kubernetes_spec import LabelValue, keys_match_pattern
from api.schemas.spec import DNS_LABEL, LabelKey
from api.webhooks.messages import DEFAULT_EVENT_TYPES

# A receiver's URL as the API accepts it: http(s), a host (a name, or an IPv6 address in brackets), an
# optional port, no credentials, printable ASCII. Every URL this matches passes the target's syntax check
# (api/webhooks/targets.py: parse); whether its host's addresses may be called is checked when the
# subscription is made and again before each delivery.
_H16 = "[0-9A-Fa-f]{1,4}"
_IPV6 = "|".join(
    [
        f"(?:{_H16}:){{7}}{_H16}",
        f"(?:{_H16}:){{1,7}}:",
        f"(?:{_H16}:){{1,6}}:{_H16}",
        f"(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}",
        f"(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}",
        f"(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}",
        f"(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}",
        f"{_H16}:(?::{_H16}){{1,6}}",
        f":(?:(?::{_H16}){{1,7}}|:)",
    ]
)
_PORT = "(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST = r"(?:[A-Za-z0-9._~!$&'()*+,;=%-]+|\[(?:" + _IPV6 + r")\])"
URL_PATTERN = rf"^https?://{_HOST}(?::{_PORT})?(?:[/?#][\x21-\x7e]*)?$"
_URL = re.compile(URL_PATTERN)


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(
        default="default",
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL,
        description="The project whose jobs' events are delivered (the caller must be its admin).",
    )
    url: str = Field(
        min_length=1,
        max_length=2048,
        description="http(s) URL of the receiver: a host name or a bracketed IPv6 address, an optional port, "
        "no user or password, printable ASCII (percent-encode the rest).",
        json_schema_extra={"pattern": URL_PATTERN},
    )
    event_types: list[EventType] = Field(
        default_factory=lambda: list(DEFAULT_EVENT_TYPES),
        min_length=1,
        max_length=len(EventType),
        description="Event types to deliver. Default: every restart rung, hang_detected, node_excluded, the "
        "straggler and restart-anomaly events, node_quarantined and node_released, and the job's end (succeeded, "
        "failed, cancelled).",
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

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not _URL.fullmatch(value):
            raise ValueError(
                "must be an http:// or https:// URL with a host, an optional port and no user or password, "
                "in printable ASCII, e.g. https://hooks.example.com/ftplane"
            )
        return value

    @field_validator("event_types")
    @classmethod
    def _unique(cls, value: list[EventType]) -> list[EventType]:
        return list(dict.fromkeys(value))


class WebhookOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    project: str
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
    event_id: int | None = Field(
        description="The event it announces (null: a message of no job, e.g. an objective_breached)."
    )
    event_type: str
    job_id: str | None = Field(description="The event's job (null: a message of no job).")
    status: str = Field(description="pending | delivered | failed")
    attempts: int
    last_status_code: int | None
    last_error: str | None
    next_try_at: datetime | None
    created_at: datetime
    delivered_at: datetime | None
