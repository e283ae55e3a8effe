"""The webhook outbox: one delivery row per (subscription, event), and its state machine.

Events one failure stores once per rank (a job-wide hang: one `hang_detected` per silent rank)
are announced once per batch stored together: the first event's delivery carries the others
as `data.affected` (see messages.py), and the rest get no delivery of their own.

A row is written in the same transaction as the event it announces (so an event is never
stored without its deliveries, nor a delivery without its event), then the delivery task is
enqueued after commit. A delivery is

    pending --2xx--> delivered
    pending --error, attempts left--> pending (next_try_at = now + backoff)
    pending --error, attempts spent / target refused--> failed

A task first *claims* the row (one conditional UPDATE: still pending and due), which moves
`next_try_at` to the end of a lease, so a second copy of the task does nothing and a task
lost with its worker is found again by the sweep once the lease is over. Delivery is
at-least-once; the webhook-id (the row id) never changes, so receivers de-duplicate by it.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session

from api.core import queue
from api.database.tables import Event, Job, WebhookDelivery, WebhookSubscription
from api.webhooks import subscriptions
from api.webhooks.messages import PER_RANK_TYPES, standard_payload
from api.webhooks.schemas import DeliveryOut
from api.webhooks.targets import PostResult

# Retry schedule: after the n-th failed try wait FIRST_RETRY_S * 2**(n-1), capped at MAX_RETRY_S,
# times a random factor in [0.5, 1] (jitter, so receivers coming back are not hit by a herd).
# 18 tries span about five hours: 1-2 s, 2-4 s, ... then ~30-60 min apart.
FIRST_RETRY_S = 2.0
MAX_RETRY_S = 3600.0
MAX_ATTEMPTS = 18
# Retries due within this long are scheduled as a delayed task; later ones are left to the sweep.
COUNTDOWN_MAX_S = 300.0
# The sweep (beat, every 10 s: workers/celery_app.py) re-enqueues deliveries overdue by this much
# (their own task should have run by then).
SWEEP_GRACE_S = 15.0
SWEEP_BATCH = 500
# A task may run this early (countdown and clock granularity).
CLAIM_TOLERANCE_S = 2.0

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"


def new_webhook_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def retry_delay(attempts: int, rng: random.Random | None = None) -> float:
    """Seconds to wait after the `attempts`-th failed try (1-based): exponential, capped, jittered."""
    base = min(MAX_RETRY_S, FIRST_RETRY_S * 2.0 ** max(0, attempts - 1))
    return base * (rng or random).uniform(0.5, 1.0)


def lease_s(timeout_s: float) -> float:
    """How long a claim holds a delivery: longer than one POST can take (connect, write, read)."""
    return 8 * timeout_s + 30


# ---- writing the outbox (in the event's transaction) -------------------------------------------


def record(session: Session, job: Job, events: list[Event], public_url: str | None, now: datetime) -> list[str]:
    """Create the deliveries the new events call for; returns their ids (to enqueue after commit)."""
    subs = subscriptions.active(session)
    if not subs:
        return []
    rows = [
        WebhookDelivery(
            id=new_webhook_id(),
            subscription_id=sub.id,
            event_id=event.id,
            job_id=job.id,
            status=PENDING,
            attempts=0,
            next_try_at=now,
            created_at=now,
            payload=standard_payload(job, event, public_url, together),
        )
        for event, together in announcements(events)
        for sub in subs
        if subscriptions.matches(sub, job, event)
    ]
    session.add_all(rows)
    return [r.id for r in rows]


def record_message(
    session: Session, project: str, event_type: str, labels: dict[str, str], payload: dict[str, Any], now: datetime
) -> list[str]:
    """Deliveries of a message no job's event says (an objective's breach: `payload` is all there is), to the
    project's subscriptions of its type whose label selector it carries; returns their ids (to enqueue after
    commit)."""
    rows = [
        WebhookDelivery(
            id=new_webhook_id(),
            subscription_id=sub.id,
            event_id=None,
            job_id=None,
            status=PENDING,
            attempts=0,
            next_try_at=now,
            created_at=now,
            payload=payload,
        )
        for sub in subscriptions.active(session)
        if subscriptions.matches_message(sub, project, event_type, labels)
    ]
    session.add_all(rows)
    return [r.id for r in rows]


def announcements(events: list[Event]) -> list[tuple[Event, list[Event]]]:
    """(event to announce, the events it stands for): one per event, except that the per-rank events
    of one type and attempt stored together are announced by their first."""
    grouped: dict[tuple[str, int], list[Event]] = {}
    announced: list[tuple[Event, list[Event]]] = []
    for event in events:
        if event.type not in PER_RANK_TYPES:
            announced.append((event, [event]))
            continue
        group = grouped.setdefault((event.type, event.attempt), [])
        if not group:
            announced.append((event, group))
        group.append(event)
    return announced


def enqueue(delivery_id: str, countdown: float | None = None) -> bool:
    """Hand a delivery to the workers; False when the broker is down (the sweep retries it)."""
    return queue.send(queue.DELIVER_WEBHOOK, delivery_id, countdown=countdown)


def enqueue_all(delivery_ids: list[str]) -> None:
    for delivery_id in delivery_ids:
        if not enqueue(delivery_id):
            return  # the broker is down: the sweep picks up the rest


# ---- the delivery state machine (worker side) ---------------------------------------------------


@dataclass(frozen=True)
class Claim:
    delivery_id: str
    subscription_id: str
    url: str
    format: str
    secret: str
    payload: dict[str, Any]
    attempts: int


@dataclass(frozen=True)
class Outcome:
    status: str  # delivered | retrying | failed | skipped
    retry_in: float | None = None


def claim(session: Session, delivery_id: str, now: datetime, *, lease: float) -> Claim | None:
    """Take the delivery for one try, or None when it is not due, already done, or held by another task."""
    result = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == delivery_id,
            WebhookDelivery.status == PENDING,
            or_(
                WebhookDelivery.next_try_at.is_(None),
                WebhookDelivery.next_try_at <= now + timedelta(seconds=CLAIM_TOLERANCE_S),
            ),
        )
        .values(attempts=WebhookDelivery.attempts + 1, next_try_at=now + timedelta(seconds=lease))
        .execution_options(synchronize_session=False)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        return None
    row = session.scalar(
        select(WebhookDelivery).where(WebhookDelivery.id == delivery_id).execution_options(populate_existing=True)
    )
    assert row is not None
    sub = session.get(WebhookSubscription, row.subscription_id)
    payload = row.payload or _rebuild_payload(session, row)
    if sub is None or not sub.active or payload is None:
        row.status = FAILED
        row.next_try_at = None
        row.last_error = "the subscription was deleted or disabled" if payload else "the event is gone"
        return None
    return Claim(
        delivery_id=row.id,
        subscription_id=sub.id,
        url=sub.url,
        format=sub.format,
        secret=sub.secret,
        payload=payload,
        attempts=row.attempts,
    )


def _rebuild_payload(session: Session, row: WebhookDelivery) -> dict[str, Any] | None:
    if row.event_id is None or row.job_id is None:
        return None
    event = session.get(Event, row.event_id)
    job = session.get(Job, row.job_id)
    return standard_payload(job, event) if event and job else None


def finish(
    session: Session,
    claimed: Claim,
    result: PostResult | None,
    now: datetime,
    *,
    refused: str | None = None,
    rng: random.Random | None = None,
) -> Outcome:
    """Record one try: delivered, failed for good, or pending again after a backoff."""
    values: dict[str, Any]
    if result is not None and result.ok:
        outcome = Outcome(DELIVERED)
        values = {
            "status": DELIVERED,
            "delivered_at": now,
            "next_try_at": None,
            "last_status_code": result.status_code,
            "last_error": None,
        }
    else:
        code = result.status_code if result is not None else None
        error = refused or (result.error if result is not None else None) or "unknown error"
        if refused is not None or claimed.attempts >= MAX_ATTEMPTS:
            if refused is None:
                error = f"{error} (gave up after {claimed.attempts} tries)"
            outcome = Outcome(FAILED)
            values = {"status": FAILED, "next_try_at": None}
        else:
            delay = retry_delay(claimed.attempts, rng)
            outcome = Outcome("retrying", delay)
            values = {"next_try_at": now + timedelta(seconds=delay)}
        values.update(last_status_code=code, last_error=error[:2000])
    updated = session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == claimed.delivery_id, WebhookDelivery.status == PENDING)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    if updated.rowcount != 1:  # type: ignore[attr-defined]
        return Outcome("skipped")  # deleted with its subscription meanwhile
    return outcome


def due(session: Session, now: datetime, *, limit: int = SWEEP_BATCH) -> list[str]:
    """Pending deliveries whose try is overdue and that no task holds (lost task, dead worker)."""
    cutoff = now - timedelta(seconds=SWEEP_GRACE_S)
    return list(
        session.scalars(
            select(WebhookDelivery.id)
            .where(WebhookDelivery.status == PENDING, WebhookDelivery.next_try_at <= cutoff)
            .order_by(WebhookDelivery.next_try_at)
            .limit(limit)
        )
    )


# ---- the delivery log (admin API) --------------------------------------------------------------


def redeliver(session: Session, subscription_id: str, delivery_id: str, now: datetime) -> WebhookDelivery | None:
    """Send again now with the same webhook-id; the retry schedule starts over."""
    row = session.get(WebhookDelivery, delivery_id)
    if row is None or row.subscription_id != subscription_id:
        return None
    row.status = PENDING
    row.attempts = 0
    row.next_try_at = now
    row.delivered_at = None
    return row


# A delivery's event type: its event's, or for a message of no event (an objective's breach) its payload's.
_EVENT_TYPE = func.coalesce(Event.type, WebhookDelivery.payload["type"].as_string())


def _encode_cursor(row: WebhookDelivery) -> str:
    raw = json.dumps([row.created_at.isoformat(), row.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, delivery_id = json.loads(base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()))
        return datetime.fromisoformat(created), str(delivery_id)
    except Exception as exc:  # any malformed input is the caller's error
        raise ValueError("cursor is not one this server returned") from exc


def log_page(
    session: Session,
    subscription_id: str,
    *,
    status: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> tuple[list[DeliveryOut], str | None]:
    """Newest first. Raises ValueError on a bad cursor."""
    query = (
        select(WebhookDelivery, _EVENT_TYPE)
        .outerjoin(Event, Event.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.subscription_id == subscription_id)
    )
    if status:
        query = query.where(WebhookDelivery.status == status)
    if cursor:
        created, delivery_id = _decode_cursor(cursor)
        query = query.where(
            or_(
                WebhookDelivery.created_at < created,
                and_(WebhookDelivery.created_at == created, WebhookDelivery.id < delivery_id),
            )
        )
    query = query.order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id.desc()).limit(limit + 1)
    found = session.execute(query).all()
    items = [_out(row, event_type) for row, event_type in found[:limit]]
    next_cursor = _encode_cursor(found[limit - 1][0]) if len(found) > limit else None
    return items, next_cursor


def one(session: Session, delivery_id: str) -> DeliveryOut | None:
    found = session.execute(
        select(WebhookDelivery, _EVENT_TYPE)
        .outerjoin(Event, Event.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.id == delivery_id)
    ).first()
    return _out(found[0], found[1]) if found else None


def _out(row: WebhookDelivery, event_type: str) -> DeliveryOut:
    return DeliveryOut(
        id=row.id,
        subscription_id=row.subscription_id,
        event_id=row.event_id,
        event_type=event_type,
        job_id=row.job_id,
        status=row.status,
        attempts=row.attempts,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
        next_try_at=row.next_try_at if row.status == PENDING else None,
        created_at=row.created_at,
        delivered_at=row.delivered_at,
    )
