"""Duty: evaluate each ETTR objective (api/services/fleet/objectives.py) at most every FTPLANE_OBJECTIVE_INTERVAL_S,
and announce each new breach once (api/services/fleet/breaches.py). Database only; each objective in a transaction
of its own, its row locked."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from api.core.config import get_settings
from api.database.tables import Objective
from api.schemas.events import utcnow
from api.services.fleet import breaches

log = logging.getLogger(__name__)


def run_once(session: Session, now: datetime | None = None) -> int:
    now = now or utcnow()
    due = now - timedelta(seconds=get_settings().objective_interval_s)
    ids = session.scalars(
        select(Objective.id).where(or_(Objective.evaluated_at.is_(None), Objective.evaluated_at <= due))
    ).all()
    session.commit()
    done = 0
    for objective_id in ids:
        try:
            objective = session.scalar(select(Objective).where(Objective.id == objective_id).with_for_update())
            if objective is not None:
                breaches.check(session, objective, now)
                done += 1
            session.commit()
        except Exception:
            session.rollback()
            log.exception("evaluate objectives: objective %s failed; it is retried on the next pass", objective_id)
    return done
