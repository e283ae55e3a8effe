"""What happens after new events are stored: fan-out to subscribers (webhooks, metrics).

`events_stored` runs inside the storing transaction. Webhook deliveries are written there too
(the outbox), and everything that reaches outside the database (enqueueing the delivery
tasks, counting metrics) runs only once that transaction commits: a rolled-back event
announces nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from api import metrics
from api.core.config import get_settings
from api.database.tables import Event, Job
from api.schemas.events import utcnow
from api.webhooks import outbox

log = logging.getLogger(__name__)

_AFTER_COMMIT = "ftplane.after_commit"


def events_stored(session: Session, job: Job, stored: list[Event]) -> None:
    """Called in the storing transaction with the rows that are new (never with a resend)."""
    if not stored:
        return
    delivery_ids = outbox.record(session, job, stored, get_settings().resolved_public_url, utcnow())
    if delivery_ids:
        after_commit(session, lambda: outbox.enqueue_all(delivery_ids))
    observed = [metrics.EventFacts.of(e) for e in stored]
    after_commit(session, lambda: metrics.events_observed(observed))


def heartbeats_ingested(count: int) -> None:
    metrics.heartbeats_ingested(count)


def after_commit(session: Session, callback: Callable[[], Any]) -> None:
    """Run `callback` once the session's current transaction commits; never if it rolls back."""
    session.info.setdefault(_AFTER_COMMIT, []).append(callback)


@event.listens_for(Session, "after_commit")
def _run_after_commit(session: Session) -> None:
    for callback in session.info.pop(_AFTER_COMMIT, []):
        try:
            callback()
        except Exception:  # the commit has happened; a failing side effect must not undo the request
            log.exception("after-commit action failed")


@event.listens_for(Session, "after_transaction_end")
def _forget_on_rollback(session: Session, transaction: SessionTransaction) -> None:
    if transaction.parent is None:  # the outermost transaction ended without committing
        session.info.pop(_AFTER_COMMIT, None)
