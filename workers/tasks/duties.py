"""Tasks (beat): one per supervision duty, each a pass over its batch of jobs (workers/supervision)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session

from api.core.db import session_scope
from workers.celery_app import celery_app
from workers.supervision import (
    cancel_jobs,
    detect_restart_anomalies,
    detect_silent_ranks,
    detect_stragglers,
    launch_attempts,
    reconcile_attempts,
    release_finished_jobs,
    time_out_pending,
)

log = logging.getLogger(__name__)


def _pass(duty: str, run_once: Callable[[Session], int]) -> int:
    with session_scope() as session:
        done = run_once(session)
    log.debug("%s: %d job(s)", duty, done)
    return done


@celery_app.task(name="ftplane.launch_attempts")
def launch_attempts_task() -> int:
    return _pass("launch attempts", launch_attempts.run_once)


@celery_app.task(name="ftplane.reconcile_attempts")
def reconcile_attempts_task() -> int:
    return _pass("reconcile attempts", reconcile_attempts.run_once)


@celery_app.task(name="ftplane.detect_silent_ranks")
def detect_silent_ranks_task() -> int:
    return _pass("detect silent ranks", detect_silent_ranks.run_once)


@celery_app.task(name="ftplane.detect_stragglers")
def detect_stragglers_task() -> int:
    return _pass("detect stragglers", detect_stragglers.run_once)


@celery_app.task(name="ftplane.detect_restart_anomalies")
def detect_restart_anomalies_task() -> int:
    return _pass("detect restart anomalies", detect_restart_anomalies.run_once)


@celery_app.task(name="ftplane.time_out_pending_attempts")
def time_out_pending_task() -> int:
    return _pass("time out pending attempts", time_out_pending.run_once)


@celery_app.task(name="ftplane.cancel_jobs")
def cancel_jobs_task() -> int:
    return _pass("cancel jobs", cancel_jobs.run_once)


@celery_app.task(name="ftplane.release_finished_jobs")
def release_finished_jobs_task() -> int:
    return _pass("release finished jobs", release_finished_jobs.run_once)
