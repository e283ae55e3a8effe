"""Duty: free what an ended job leaves behind, once.

A job given up on may still have processes or pods (a hung launcher, the pods of a partly
scheduled attempt): they are asked to stop, and a later pass goes on once they are gone. Then the
backend removes what outlives attempts (the token Secret). The job's trainer tokens are revoked first
(its trainers flushed their reports before they exited; those still stopping lose what they had left
to send). A backend that cannot be reached is tried again on the next passes for
RELEASE_RETRY_WINDOW, then left to an operator with a warning; the tokens are revoked in any case.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Job
from api.schemas.events import utcnow
from api.services import lifecycle
from api.services.lifecycle import JobStatus
from workers import backends
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)

RELEASE_RETRY_WINDOW = timedelta(hours=1)


def run_once(session: Session) -> int:
    return for_each_job(session, models.jobs.to_release(session), release, "release")


def release(session: Session, job: Job) -> None:
    if job.status not in lifecycle.TERMINAL or job.released_at is not None:
        return
    models.tokens.revoke_job_tokens(session, job.id)
    spec = lifecycle.spec_of(job)
    try:
        backend = backends.get_backend(job.backend)
        if job.status == JobStatus.FAILED and not backend.stop(job.id, job.attempt, spec):
            session.commit()  # the revocation stands
            return
        backend.delete_job_resources(job.id, spec)
    except backends.UnknownBackend:
        pass  # nothing was ever launched
    except Exception:
        if job.finished_at is not None and utcnow() - job.finished_at < RELEASE_RETRY_WINDOW:
            session.commit()  # the revocation stands
            log.warning("could not release the backend resources of job %s; retrying", job.id, exc_info=True)
            return
        log.error("gave up releasing the backend resources of job %s: clean them up by hand", job.id, exc_info=True)
    job.released_at = utcnow()
