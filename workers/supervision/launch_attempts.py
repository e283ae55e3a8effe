"""Duty: launch the current attempt of new and restarted jobs, once each, through their backend.

A restarted job's previous attempt is torn down first (what is left of it: a hung launcher,
surviving pods), so two attempts never hold the same resources. The teardown is asked for, not waited
on: while the old attempt's processes take their grace, the pass goes on with other jobs, and a later
pass launches the new attempt once the backend says the old one is gone.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session

from api import models
from api.core.config import get_settings
from api.core.killpoints import kill_point
from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import utcnow
from api.schemas.fleet_nodes import fleet_name
from api.services import lifecycle, node_reputation, quotas
from api.services.lifecycle import AttemptStatus, JobStatus
from workers import backends
from workers.backends.base import LaunchRequest
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)

# A PENDING job whose submit task has not run after this long is launched by the pass.
SUBMIT_GRACE = timedelta(seconds=5)
# How long a launch that fails with a retryable backend error is tried again before the job fails.
LAUNCH_RETRY_WINDOW = timedelta(minutes=15)


def run_once(session: Session) -> int:
    return for_each_job(session, models.jobs.to_launch(session, utcnow() - SUBMIT_GRACE), launch_job, "launch")


def launch(session: Session, job_id: str) -> None:
    """The submit task's fast path: launch this job's current attempt now."""
    for_each_job(session, [job_id], launch_job, "launch")


def launch_job(session: Session, job: Job) -> None:
    """Idempotent: an attempt already launched is left alone; a launch redone after a crash is a no-op."""
    if JobStatus(job.status) in lifecycle.TERMINAL or job.cancel_requested:
        return
    attempt = lifecycle.current_attempt(session, job)
    if attempt.status != AttemptStatus.PENDING:
        return
    if job.attempt == 0:  # a restarted job was admitted with its first attempt and keeps its place
        waiting = quotas.admit(session, job)
        if waiting is not None:
            lifecycle.launch_waits(session, job, attempt, waiting)
            return
        lifecycle.launch_admitted(session, job, attempt)
    spec = lifecycle.spec_of(job)
    try:
        backend = backends.get_backend(job.backend)
    except backends.UnknownBackend as exc:
        lifecycle.fail(session, job, attempt, Cause(CauseClass.launch, str(exc)))
        return
    # A job restart: what is left of the attempt it replaces goes first (idempotent).
    if job.attempt > 0 and not backend.stop(job.id, job.attempt - 1, spec):
        log.info("job %s attempt %s waits for attempt %s to stop", job.id, job.attempt, job.attempt - 1)
        return
    # The token is committed before the launch, so a process started by a launch whose
    # bookkeeping is lost to a crash still holds a valid token.
    _, token = models.tokens.create_trainer(session, job.id, name=f"trainer:{job.name}:a{job.attempt}")
    session.commit()
    request = LaunchRequest(
        job_id=job.id,
        attempt=job.attempt,
        spec=spec,
        token=token,
        control_plane_url=get_settings().resolved_public_url,
        excluded_nodes=tuple(job.excluded_nodes),
        quarantined_nodes=node_reputation.quarantined_nodes(session),
    )
    try:
        backend.launch(request)
    except Exception as exc:
        cause = Cause(CauseClass.launch, f"launch failed: {type(exc).__name__}: {exc}")
        if getattr(exc, "retryable", False) and utcnow() - attempt.created_at < LAUNCH_RETRY_WINDOW:
            # A transient backend outage (API 5xx, timeouts): the next pass launches again.
            log.warning("job %s attempt %s: %s; retrying on the next pass", job.id, job.attempt, cause.message)
            lifecycle.launch_deferred(attempt, cause)
            return
        log.exception("launch of job %s attempt %s failed", job.id, job.attempt)
        lifecycle.fail(session, job, attempt, cause)
        return
    kill_point("launch.started", job=job.id, attempt=job.attempt)  # test-only: off unless set
    lifecycle.attempt_launched(session, job, attempt, note=_unavoided(job, backend, request))


def _unavoided(job: Job, backend: object, request: LaunchRequest) -> str | None:
    """What the attempt's `submitted` says of the nodes it should avoid but its backend cannot (local: every node
    runs on this machine): the job's excluded nodes, and the quarantined ones among those it runs on."""
    if getattr(backend, "can_exclude_nodes", True):
        return None
    quarantined = request.quarantined_nodes
    its_nodes = getattr(backend, "nodes", None)
    if callable(its_nodes):
        used = {fleet_name(n.name) for n in its_nodes(job.id, job.attempt, request.spec)}
        quarantined = tuple(q for q in quarantined if q in used)
    notes = []
    if job.excluded_nodes:
        notes.append(
            f"the {job.backend} backend cannot avoid the excluded node(s) {', '.join(job.excluded_nodes)}: "
            "the blame is recorded, the attempt runs where the backend can run it"
        )
    if quarantined:
        notes.append(
            f"the {job.backend} backend cannot avoid the quarantined node(s) {', '.join(quarantined)}: "
            "the quarantine is recorded, the attempt runs where the backend can run it"
        )
    return "; ".join(notes) or None
