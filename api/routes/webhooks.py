"""`/v1/webhooks`: subscriptions to a project's job events, their delivery log, and redelivery (the project's
admins)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, status
from pydantic import BaseModel

from api.core.authz import Principal, Role
from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.core.openapi import CURSOR_DESCRIPTION, CURSOR_PATTERN, link, links
from api.database.tables import WebhookSubscription
from api.deps import AuditDep, MemberDep, SessionDep, authorize, project_for
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


def webhook_admin(request: Request, webhook_id: str, session: SessionDep, principal: MemberDep) -> Principal:
    """An admin of the webhook's project (anyone else: 404, as for a webhook that does not exist)."""
    row = subscriptions.get(session, webhook_id)
    if row is None:
        raise ApiError(404, f"no webhook with id {webhook_id!r}", field="webhook_id")
    trail = getattr(request.state, "audit", None)
    if trail is not None:
        trail.about(project=row.project)
    authorize(principal, row.project, Role.admin, f"webhook with id {webhook_id!r}", "webhook_id")
    return principal


WebhookAdminDep = Annotated[Principal, Depends(webhook_admin)]


_HOOK = "$response.body#/id"


@router.post(
    "",
    response_model=WebhookCreated,
    status_code=status.HTTP_201_CREATED,
    responses=links(
        201,
        GetWebhook=link("GET", "/v1/webhooks/{webhook_id}", "The subscription.", webhook_id=_HOOK),
        DeleteWebhook=link("DELETE", "/v1/webhooks/{webhook_id}", "Unsubscribe.", webhook_id=_HOOK),
        ListDeliveries=link("GET", "/v1/webhooks/{webhook_id}/deliveries", "Its delivery log.", webhook_id=_HOOK),
    ),
)
def create_webhook(
    body: WebhookIn, request: Request, session: SessionDep, principal: MemberDep, audit: AuditDep
) -> WebhookCreated:
    """Subscribe a URL to the events of a project's jobs. The signing secret is in this response only: store it
    now. The caller must be an admin of the project (an unknown project, or one the caller holds no role in:
    422 naming it).

    Unless FTPLANE_WEBHOOK_ALLOW_PRIVATE is true, every address the URL's host resolves to must be public
    (not loopback, private, link-local, shared, multicast or reserved): a host that resolves otherwise, or
    not at all, is refused with 422. The schema cannot say which hosts those are.
    """
    project_for(session, request, principal, body.project, Role.admin)
    try:
        row, secret = subscriptions.create(session, body, allow_private=get_settings().webhook_allow_private)
    except targets.TargetRefused as exc:
        raise ApiError(422, str(exc), field="url") from exc
    if audit is not None:
        audit.about(object_id=row.id)
    return WebhookCreated.model_validate({**WebhookOut.model_validate(row).model_dump(), "secret": secret})


@router.get("", response_model=list[WebhookOut])
def list_webhooks(session: SessionDep, principal: MemberDep) -> list[WebhookOut]:
    """The subscriptions of the projects the caller is an admin of."""
    rows = subscriptions.list_all(session, principal.projects(Role.admin))
    return [WebhookOut.model_validate(row) for row in rows]


@router.get("/{webhook_id}", response_model=WebhookOut, responses=responses(404))
def get_webhook(webhook_id: str, session: SessionDep, _: WebhookAdminDep) -> WebhookOut:
    return WebhookOut.model_validate(load_subscription(session, webhook_id))


@router.delete("/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404))
def delete_webhook(webhook_id: str, session: SessionDep, _: WebhookAdminDep) -> None:
    """Unsubscribe; the subscription's delivery log and pending deliveries go with it."""
    if not subscriptions.remove(session, webhook_id):
        raise ApiError(404, f"no webhook with id {webhook_id!r}", field="webhook_id")


_PAGE_LINKS = links(
    200,
    Redeliver=link(
        "POST",
        "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver",
        "Send the page's first delivery again.",
        webhook_id="$request.path.webhook_id",
        delivery_id="$response.body#/items/0/id",
    ),
    NextPage=link(
        "GET",
        "/v1/webhooks/{webhook_id}/deliveries",
        "The next page.",
        webhook_id="$request.path.webhook_id",
        cursor="$response.body#/next_cursor",
    ),
)


@router.get("/{webhook_id}/deliveries", response_model=DeliveryPage, responses={**responses(404), **_PAGE_LINKS})
def list_deliveries(
    webhook_id: str,
    session: SessionDep,
    _: WebhookAdminDep,
    status_: Literal["pending", "delivered", "failed"] | None = Query(default=None, alias="status"),
    cursor: str | None = Query(default=None, max_length=512, pattern=CURSOR_PATTERN, description=CURSOR_DESCRIPTION),
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
def redeliver(webhook_id: str, delivery_id: str, session: SessionDep, _: WebhookAdminDep) -> DeliveryOut:
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
