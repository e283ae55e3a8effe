"""Webhook subscriptions: create (with a fresh signing secret), list, delete, and match events."""

from __future__ import annotations

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.core.security import new_id
from api.database.tables import Event, Job, WebhookDelivery, WebhookSubscription
from api.schemas.events import utcnow
from api.webhooks import targets
from api.webhooks.messages import new_secret
from api.webhooks.schemas import WebhookIn


def create(session: Session, body: WebhookIn, *, allow_private: bool) -> tuple[WebhookSubscription, str]:
    """Raises targets.TargetRefused for a URL the control plane may not call."""
    targets.validate(body.url, allow_private=allow_private)
    secret = new_secret()
    row = WebhookSubscription(
        id=new_id(),
        project=body.project,
        url=body.url,
        event_types=[t.value for t in body.event_types],
        label_selector=dict(body.label_selector),
        format=body.format,
        secret=secret,
        active=True,
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row, secret


def list_all(session: Session, projects: list[str] | None = None) -> list[WebhookSubscription]:
    """Every subscription (`projects` None), or those of these projects."""
    query = select(WebhookSubscription).order_by(WebhookSubscription.created_at)
    if projects is not None:
        query = query.where(WebhookSubscription.project.in_(projects))
    return list(session.scalars(query))


def get(session: Session, subscription_id: str) -> WebhookSubscription | None:
    return session.get(WebhookSubscription, subscription_id)


def remove(session: Session, subscription_id: str) -> bool:
    """Delete the subscription and its delivery log; pending deliveries are dropped."""
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.subscription_id == subscription_id))
    result = session.execute(delete(WebhookSubscription).where(WebhookSubscription.id == subscription_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def active(session: Session) -> list[WebhookSubscription]:
    return list(session.scalars(select(WebhookSubscription).where(WebhookSubscription.active.is_(True))))


def matches(subscription: WebhookSubscription, job: Job, event: Event) -> bool:
    """A subscription hears of its own project's jobs only."""
    if subscription.project != job.project or event.type not in subscription.event_types:
        return False
    labels = job.labels or {}
    return all(labels.get(key) == value for key, value in (subscription.label_selector or {}).items())


def matches_message(subscription: WebhookSubscription, project: str, event_type: str, labels: dict[str, str]) -> bool:
    """A message of no job (an objective's breach): its project's subscriptions of its type, whose label selector
    the message's labels (the objective's selector) carry."""
    if subscription.project != project or event_type not in subscription.event_types:
        return False
    return all(labels.get(key) == value for key, value in (subscription.label_selector or {}).items())
