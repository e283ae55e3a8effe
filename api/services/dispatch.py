"""Hands work to the Celery workers by task name (the API never runs backend calls inline)."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

SUBMIT_JOB = "ftplane.submit_job"
CANCEL_JOB = "ftplane.cancel_job"
INJECT_FAULT = "ftplane.inject_fault"
SUPERVISE_JOBS = "ftplane.supervise_jobs"


def send(task: str, *args: Any) -> bool:
    """Enqueue; False when the broker is unreachable (the supervisor's sweep picks the work up later)."""
    from workers.celery_app import celery_app

    try:
        celery_app.send_task(task, args=list(args))
        return True
    except Exception:  # the broker being down must not fail an accepted request
        log.warning("could not enqueue %s for %s; the next supervision sweep will retry", task, args, exc_info=True)
        return False
