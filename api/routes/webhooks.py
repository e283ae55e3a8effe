"""`/v1/webhooks`: subscriptions to job events, their delivery log, and redelivery (admin only)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel

from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.database.tables import WebhookSubscription
from api.deps import AdminDep, SessionDep
from api.schemas.events import utcnow
from api.webhooks import outbox, subscriptions, targets
from api.webhooks.schemas import DeliveryOut, WebhookCreated, WebhookIn, WebhookOut

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


class DeliveryPage(BaseModel):
    items: list[DeliveryOut]
    next_cursor: str | None


def load_subscription(session: SessionDep, webhook_id: str) -> WebhookSubscription:
    row = subscriptions.get(session, webhook_id)
    if row is None:
        raise ApiError(404, f"no webhook with id {webhook_id!r}", field="webhook_id")
    return row


@router.post("", response_model=WebhookCreated, status_code=status.HTTP_201_CREATED)
def create_webhook(body: WebhookIn, session: SessionDep, _: AdminDep) -> WebhookCreated:
    """Subscribe a URL to job events. The signing secret is in this response only: store it now."""
    try:
        row, secret = subscriptions.create(session, body, allow_private=get_settings().webhook_allow_private)
    except targets.TargetRefused as exc:
        raise ApiError(422, str(exc), field="url") from exc
    return WebhookCreated.model_validate({**WebhookOut.model_validate(row).model_dump(), "secret": secret})


@router.get("", response_model=list[WebhookOut])
def list_webhooks(session: SessionDep, _: AdminDep) -> list[WebhookOut]:
    return [WebhookOut.model_validate(row) for row in subscriptions.list_all(session)]


@router.get("/{webhook_id}", response_model=WebhookOut, responses=responses(404))
def get_webhook(webhook_id: str, session: SessionDep, _: AdminDep) -> WebhookOut:
    return WebhookOut.model_validate(load_subscription(session, webhook_id))


@router.delete("/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404))
def delete_webhook(webhook_id: str, session: SessionDep, _: AdminDep) -> None:
    """Unsubscribe; the subscription's delivery log and pending deliveries go with it."""
    if not subscriptions.remove(session, webhook_id):
        raise ApiError(404, f"no webhook with id {webhook_id!r}", field="webhook_id")


@router.get("/{webhook_id}/deliveries", response_model=DeliveryPage, responses=responses(404))
def list_deliveries(
    webhook_id: str,
    session: SessionDep,
    _: AdminDep,
    status_: Literal["pending", "delivered", "failed"] | None = Query(default=None, alias="status"),
    cursor: str | None = Query(default=None, max_length=512),
    limit: int = Query(default=100, ge=1, le=1000),
) -> DeliveryPage:
    """The delivery log, newest first: status, last status code and error, tries, next try."""
    load_subscription(session, webhook_id)
    try:
        items, next_cursor = outbox.log_page(session, webhook_id, status=status_, cursor=cursor, limit=limit)
    except ValueError as exc:
        raise ApiError(422, str(exc), field="cursor") from exc
    return DeliveryPage(items=items, next_cursor=next_cursor)


@router.post(
    "/{webhook_id}/deliveries/{delivery_id}/redeliver",
    response_model=DeliveryOut,
    status_code=status.HTTP_202_ACCEPTED,
    responses=responses(404),
)
def redeliver(webhook_id: str, delivery_id: str, session: SessionDep, _: AdminDep) -> DeliveryOut:
    """Send a delivery again, now, with the same webhook-id (receivers de-duplicate by it)."""
    load_subscription(session, webhook_id)
    row = outbox.redeliver(session, webhook_id, delivery_id, utcnow())
    if row is None:
        raise ApiError(404, f"no delivery {delivery_id!r} for webhook {webhook_id!r}", field="delivery_id")
    session.commit()
    outbox.enqueue(row.id)
    out = outbox.one(session, row.id)
    assert out is not None
    return out
