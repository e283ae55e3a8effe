"""What happens after new events are stored: fan-out to subscribers (webhooks, metrics)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.database.tables import Event, Job


def events_stored(session: Session, job: Job, stored: list[Event]) -> None:
    """Called in the storing transaction with the rows that are new (never with a resend)."""
    return None
