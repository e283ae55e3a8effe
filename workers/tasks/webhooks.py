"""Tasks: deliver one webhook (claim, sign, POST, record, back off) and sweep for lost deliveries."""

from __future__ import annotations

import logging

from api import metrics
from api.core import queue
from api.core.config import get_settings
from api.core.db import session_scope
from api.core.killpoints import kill_point
from api.schemas.events import utcnow
from api.webhooks import messages, outbox, targets
from workers.celery_app import celery_app

log = logging.getLogger(__name__)


@celery_app.task(name=queue.DELIVER_WEBHOOK)
def deliver_webhook(delivery_id: str) -> str:
    """One try of one delivery; schedules the next try itself when it is near, else the sweep does."""
    settings = get_settings()
    with session_scope() as session:
        claim = outbox.claim(session, delivery_id, utcnow(), lease=outbox.lease_s(settings.webhook_timeout_s))
    if claim is None:
        return "skipped"  # done, not due yet, or another task holds it
    body = messages.render(claim.payload, claim.format)
    headers = messages.signed_headers(claim.secret, claim.delivery_id, body)
    result: targets.PostResult | None = None
    refused: str | None = None
    try:
        result = targets.post(
            claim.url,
            body,
            headers,
            timeout_s=settings.webhook_timeout_s,
            allow_private=settings.webhook_allow_private,
        )
    except targets.TargetRefused as exc:
        refused = f"target refused: {exc}"
    except Exception as exc:  # a bug here must end as a logged, retried try, not a lost delivery
        log.exception("webhook delivery %s crashed", delivery_id)
        result = targets.PostResult(None, f"internal error: {type(exc).__name__}: {exc}")
    kill_point("webhook.posted", delivery=delivery_id, status=result and result.status_code)  # test-only
    with session_scope() as session:
        outcome = outbox.finish(session, claim, result, utcnow(), refused=refused)
    metrics.webhook_delivery(outcome.status)
    code = result.status_code if result else None
    error = refused or (result.error if result else None)
    if outcome.status == outbox.DELIVERED:
        log.info("webhook %s delivered to subscription %s (HTTP %s)", delivery_id, claim.subscription_id, code)
    else:
        log.warning(
            "webhook %s to subscription %s: try %d %s (%s)%s",
            delivery_id,
            claim.subscription_id,
            claim.attempts,
            outcome.status,
            error,
            f"; next try in {outcome.retry_in:.1f} s" if outcome.retry_in is not None else "",
        )
    if outcome.retry_in is not None and outcome.retry_in <= outbox.COUNTDOWN_MAX_S:
        outbox.enqueue(delivery_id, countdown=outcome.retry_in)
    return outcome.status


@celery_app.task(name=queue.SWEEP_WEBHOOK_DELIVERIES)
def sweep_webhook_deliveries() -> int:
    """Re-enqueue deliveries that are overdue and unheld: a lost task, a dead worker, a far retry."""
    with session_scope() as session:
        due = outbox.due(session, utcnow())
    for delivery_id in due:
        if not outbox.enqueue(delivery_id):
            break
    if due:
        log.info("re-enqueued %d overdue webhook deliveries", len(due))
    return len(due)
