"""One job at a time, each in its own transaction: a broken job never stops a duty's pass over the others."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job

log = logging.getLogger(__name__)


def for_each_job(session: Session, job_ids: Iterable[str], act: Callable[[Session, Job], object], duty: str) -> int:
    """Lock each job's row, `act` on it and commit; a failure is rolled back, logged and retried next pass."""
    done = 0
    for job_id in job_ids:
        try:
            job = models.jobs.get(session, job_id, for_update=True)
            if job is not None:
                act(session, job)
                done += 1
            session.commit()
        except Exception:
            session.rollback()
            log.exception("%s: job %s failed; it is retried on the next pass", duty, job_id)
    return done
