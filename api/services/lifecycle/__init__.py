"""The job lifecycle: every job and attempt status transition, and the recovery ladder.

    states    the job's and the attempt's statuses, what each may become, and the moves
    ladder    the rungs, their budgets, and `next_rung`: what a failed attempt leads to (pure)
    effects   what a reported event does to a job in each status (`changes_job`, `apply_reported_event`)
    failures  an attempt's failure and the job restart that follows it; the in-job restarts counted
    spec      the job's spec, validated once per loaded row

Nothing else assigns `job.status` or `attempt.status`: routes, the ingest path and the supervision
duties ask this package, through the names below. Its decisions touch the database only; what they ask
of a backend (tear an attempt down, launch the next one) is done by the supervision duties.
"""

from __future__ import annotations

from api.schemas.rungs import RungName
from api.schemas.status import AttemptStatus, JobStatus
from api.services.lifecycle.effects import EFFECTS, RECOVERY_EVENTS, Effect, apply_reported_event, changes_job
from api.services.lifecycle.failures import (
    InJobRestart,
    attempt_failed,
    highest_step,
    in_job_restarts_seen,
    note_failure,
    preemptions_spent,
)
from api.services.lifecycle.ladder import (
    FINAL_CAUSES,
    LADDER,
    NO_PROGRESS_FAILURES,
    PENDING_TIMEOUT,
    QUEUED_TIMEOUT,
    RUNG,
    Budgets,
    Decision,
    Failure,
    Rung,
    budgets,
    next_rung,
    progress_stalled,
)
from api.services.lifecycle.spec import spec_of
from api.services.lifecycle.states import (
    ACTIVE,
    ALLOWED,
    ATTEMPT_ALLOWED,
    ATTEMPT_ENDED,
    TERMINAL,
    TERMINAL_EVENT,
    InvalidTransition,
    attempt_launched,
    attempt_running,
    cancel,
    current_attempt,
    fail,
    finish_attempt,
    launch_admitted,
    launch_deferred,
    launch_waits,
    record,
    succeed,
    transition,
)

__all__ = [
    "ACTIVE",
    "ALLOWED",
    "ATTEMPT_ALLOWED",
    "ATTEMPT_ENDED",
    "EFFECTS",
    "FINAL_CAUSES",
    "LADDER",
    "NO_PROGRESS_FAILURES",
    "PENDING_TIMEOUT",
    "QUEUED_TIMEOUT",
    "RECOVERY_EVENTS",
    "RUNG",
    "TERMINAL",
    "TERMINAL_EVENT",
    "AttemptStatus",
    "Budgets",
    "Decision",
    "Effect",
    "Failure",
    "InJobRestart",
    "InvalidTransition",
    "JobStatus",
    "Rung",
    "RungName",
    "apply_reported_event",
    "attempt_failed",
    "attempt_launched",
    "attempt_running",
    "budgets",
    "cancel",
    "changes_job",
    "current_attempt",
    "fail",
    "finish_attempt",
    "highest_step",
    "in_job_restarts_seen",
    "launch_admitted",
    "launch_deferred",
    "launch_waits",
    "next_rung",
    "note_failure",
    "preemptions_spent",
    "progress_stalled",
    "record",
    "spec_of",
    "succeed",
    "transition",
]
