"""Duty: stragglers: ranks that keep the job slow, raised once per episode and cleared when they recover.

It reads the database only (rank liveness and the job's watch), like detect_silent_ranks. Each pass
scores the ranks of every job whose current attempt runs and keeps the window between passes
(api/services/stragglers: the scoring, the window, the episodes and their events). While a job is
recovering its ranks restart: no pass then.

With `resiliency.stragglers.action: exclude`, an episode that has lasted `exclude_after_s` (default:
the window) restarts the job without the straggler's node, through the lifecycle as a failed node
would: the job restart budget, the no-progress rule, `exclude_failed_nodes` (which the spec then
requires). The decision is recorded as the job_restart and node_excluded events, whose cause is the
straggler (cause_class straggler, its rank, node and score). Where that restart is not to be had (the
budget is spent, or every node of the job straggles, so no one node is to blame) a slow job is better
than a failed one: the job runs on, and the episode says why it was not excluded (its watch, and the log).

Episodes of attempts that no longer run are closed (straggler_cleared), and their window forgotten, by the same
duty.
"""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Attempt, Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import utcnow
from api.schemas.spec import JobSpec
from api.services import lifecycle, stragglers
from api.services.ingest import reporting
from api.services.lifecycle import AttemptStatus, JobStatus
from api.services.stragglers.window import jobs_watched, not_excluded, note_decision
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)


def run_once(session: Session, now: datetime | None = None) -> int:
    running = models.jobs.with_current_attempt_in(session, [AttemptStatus.RUNNING])
    done = for_each_job(session, running, lambda s, job: check(s, job, now), "detect stragglers")
    ended = [job_id for job_id in jobs_watched(session) if job_id not in set(running)]
    for_each_job(session, ended, lambda s, job: close_ended(s, job, now), "detect stragglers")
    return done


def check(session: Session, job: Job, now: datetime | None = None) -> None:
    """One pass over the job's ranks; an episode past exclude_after_s moves the job off its node."""
    spec = lifecycle.spec_of(job)
    cfg = spec.resiliency.stragglers
    attempt = lifecycle.current_attempt(session, job)
    if not cfg.enabled or attempt.status != AttemptStatus.RUNNING or job.status != JobStatus.RUNNING:
        return
    found = stragglers.observe(session, job, spec, now)
    reporting.record_events(session, job, found.events)
    if cfg.action == "exclude":
        exclude(session, job, attempt, spec, found.open, now or utcnow())


def close_ended(session: Session, job: Job, now: datetime | None = None) -> None:
    reporting.record_events(session, job, stragglers.end_watch(session, job, now))


def exclude(
    session: Session, job: Job, attempt: Attempt, spec: JobSpec, episodes: list[stragglers.Episode], now: datetime
) -> None:
    cfg = spec.resiliency.stragglers
    after = cfg.exclude_after_s or cfg.window_s
    t = now.timestamp()
    due = [e for e in episodes if e.node and t - e.detected >= after and not_excluded(e)]
    if not due:
        return
    nodes = tuple(sorted({e.node for e in due if e.node}))
    worst = min(due, key=lambda e: e.score)
    cause = Cause(
        CauseClass.straggler,
        f"straggler: rank {worst.rank} on node {worst.node} ran at {worst.score:.2f} of the job's pace "
        f"(threshold {cfg.threshold:g}) for {t - worst.onset:.0f} s; resiliency.stragglers.action is exclude",
        {"rank": worst.rank, "node": worst.node},
    )
    failure = lifecycle.Failure(cause, nodes)
    preview = lifecycle.next_rung(job, spec, failure, preemptions=lifecycle.preemptions_spent(session, job))
    why_not = None
    if len(nodes) >= spec.nodes:
        why_not = "every node of the job has a straggler: no one node to blame"
    elif preview.gives_up or not preview.exclude:
        why_not = f"no job restart to be had ({preview.cause.message})"
    if why_not is not None:
        note_decision(session, job, due, f"not excluded: {why_not}", now)
        log.warning("job %s: straggler(s) on %s not excluded: %s", job.id, ", ".join(nodes), why_not)
        return
    closing = stragglers.close(session, job, due, f"the job restarts without node(s) {', '.join(nodes)}", now)
    reporting.record_events(session, job, closing)
    decision = lifecycle.attempt_failed(session, job, attempt, failure)
    log.warning("job %s: %s -> %s", job.id, cause.message, decision.rung.name if decision.rung else "gives up")
