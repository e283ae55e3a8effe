"""Duty: keep each job's fleet summary (api/services/fleet/) up to date: the jobs with events stored since their
summary, those never summarized, and running jobs due for a refresh, each recomputed from all its events in a
transaction of its own (its summary's row locked, never the job's). Database only."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session

from api import models
from api.core.config import get_settings
from api.schemas.events import utcnow
from api.services.fleet import pick, store

log = logging.getLogger(__name__)


def run_once(session: Session, now: datetime | None = None) -> int:
    now = now or utcnow()
    settings = get_settings()
    chosen = pick.pick(session, now, limit=settings.goodput_batch, refresh_s=settings.goodput_refresh_s)
    session.commit()
    done = 0
    for job_id in chosen.jobs:
        try:
            job = models.jobs.get(session, job_id)
            if job is not None:
                store.summarize_job(session, job, now)
            session.commit()
            done += 1
        except Exception:
            session.rollback()
            log.exception("summarize goodput: job %s failed; it is retried on the next pass", job_id)
    if done == len(chosen.jobs):
        pick.advance(session, chosen, now, settle_s=settings.goodput_settle_s)
        session.commit()
    return done
