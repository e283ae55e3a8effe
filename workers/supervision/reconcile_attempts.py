"""Duty: reconcile each launched attempt with its backend.

The backend's view (pods, launcher processes) is read off the database transaction, on a small
thread pool, and a pass waits for those reads at most READ_WAIT_S: a slow or failing read (a
Kubernetes API retried for many seconds) delays only its own job, whose result is applied by a
later pass. Each result is then applied under the job's row lock, if the job is still on the
attempt that was read: what the backend saw is recorded (rank failures, in-job restarts and their
causes), and an attempt that is over ends through the lifecycle (success, or the next rung).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor, wait

from sqlalchemy.orm import Session

from api.core.killpoints import kill_point
from api.database.tables import Attempt, Job, RankLiveness
from api.models import events as event_store
from api.models import jobs as job_store
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType
from api.schemas.spec import JobSpec
from api.services import lifecycle, reporting
from api.services.lifecycle import AttemptStatus, JobStatus
from workers import backends
from workers.backends.base import AttemptPhase
from workers.backends.base import AttemptStatus as BackendView
from workers.supervision import launch_attempts
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)

READ_WAIT_S = 1.0
READ_THREADS = 8

Target = tuple[str, int]  # (job id, attempt number)


class BackendReads:
    """Backend status reads in flight, at most one per attempt."""

    def __init__(self, threads: int = READ_THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="backend-read")
        self._in_flight: dict[Target, Future[BackendView]] = {}

    def start(self, target: Target, backend_name: str, spec: JobSpec) -> None:
        if target not in self._in_flight:
            job_id, attempt = target
            backend = backends.get_backend(backend_name)
            self._in_flight[target] = self._pool.submit(backend.status, job_id, attempt, spec)

    def collect(self, timeout: float) -> dict[Target, BackendView]:
        """Wait up to `timeout` for the reads in flight; returns those that finished (and forgets them)."""
        wait(list(self._in_flight.values()), timeout=timeout)
        done: dict[Target, BackendView] = {}
        for target, future in list(self._in_flight.items()):
            if not future.done():
                continue
            del self._in_flight[target]
            try:
                done[target] = future.result()
            except Exception:
                log.warning("reading job %s attempt %s from its backend failed", *target, exc_info=True)
        return done

    def pending(self) -> set[Target]:
        return set(self._in_flight)


READS = BackendReads()


def run_once(session: Session, reads: BackendReads = READS, wait_s: float = READ_WAIT_S) -> int:
    job_ids = job_store.with_current_attempt_in(session, [AttemptStatus.LAUNCHED, AttemptStatus.RUNNING])
    for job_id in job_ids:
        job = job_store.get(session, job_id)
        if job is not None:
            reads.start((job.id, job.attempt), job.backend, lifecycle.spec_of(job))
    session.commit()  # no transaction stays open while the reads run
    results = reads.collect(wait_s)
    restarted: list[str] = []

    def apply(session: Session, job: Job) -> None:
        view = results.get((job.id, job.attempt))  # None: the job moved on to another attempt meanwhile
        if view is not None and _apply(session, job, view):
            restarted.append(job.id)

    applied = for_each_job(session, [job_id for job_id, _ in results], apply, "reconcile")
    for job_id in restarted:  # launch the next attempt now rather than on the launch duty's next pass
        launch_attempts.launch(session, job_id)
    return applied


def _apply(session: Session, job: Job, view: BackendView) -> bool:
    """Record what the backend saw of the job's current attempt and act on its phase; True when restarted."""
    if JobStatus(job.status) in lifecycle.TERMINAL or job.cancel_requested:
        return False
    attempt = lifecycle.current_attempt(session, job)
    if attempt.status not in (AttemptStatus.LAUNCHED, AttemptStatus.RUNNING):
        return False
    _record_observations(session, job, attempt, view)
    if view.phase == AttemptPhase.running:
        lifecycle.attempt_running(attempt)
        stalled = lifecycle.progress_stalled(job)
        if stalled is not None:
            lifecycle.fail(session, job, attempt, stalled)
    elif view.phase == AttemptPhase.pending:
        if view.cause is not None:
            attempt.cause = view.cause.message  # what it waits for, shown until it runs
    elif view.phase == AttemptPhase.succeeded:
        lifecycle.succeed(session, job, attempt)
        kill_point("reconcile.ended", job=job.id, attempt=job.attempt)  # test-only: off unless set
    else:
        cause = view.cause or (
            Cause(CauseClass.unknown, "the launcher is gone")
            if view.phase == AttemptPhase.missing
            else Cause(CauseClass.unknown, "failed")
        )
        cause = _explained(session, job, cause)
        # A node its agent reported unhealthy or lost is blamed, whatever the backend saw of its end.
        blamed = event_store.nodes_named(
            session, job.id, job.attempt, [EventType.node_unhealthy, EventType.node_failed]
        )
        failure = lifecycle.Failure(cause, tuple(dict.fromkeys([*view.failed_nodes, *blamed])))
        decision = lifecycle.attempt_failed(session, job, attempt, failure)
        return not decision.gives_up
    return False


def _explained(session: Session, job: Job, cause: Cause) -> Cause:
    """A launcher that ended after spending its in-job restarts knows only its exit status; the node agents
    reported why its ranks failed. Say that, with its class (a hang, a crash, an exception)."""
    if cause.cause_class != CauseClass.crash or "rank" in cause.facts:
        return cause
    why = _last_round_cause(session, job)
    if why is None:
        return cause
    budget = lifecycle.budgets(lifecycle.spec_of(job)).in_job
    text = f"{cause.message} after rank failure ({why.message}); in-job restart budget ({budget}) spent"
    return Cause(
        why.cause_class if why.cause_class != CauseClass.unknown else cause.cause_class,
        text,
        {**cause.facts, **why.facts},
    )


def _last_round_cause(session: Session, job: Job) -> Cause | None:
    """The root cause among the rank failures since the last in-job restart (the round that ended the launcher):
    a rank killed for silence, else one killed by a signal, else the first; the rest are collateral."""
    since = event_store.latest_ts(session, job.id, job.attempt, [EventType.injob_restart])
    failed = [
        e
        for e in event_store.of_job(session, job.id, types=[EventType.rank_failed.value])
        if e.attempt == job.attempt and (since is None or e.ts >= since) and e.details.get("cause")
    ]
    if not failed:
        last = event_store.latest(session, job.id, job.attempt, [EventType.injob_restart])
        return Cause.of(last.details) if last is not None and last.details.get("cause") else None
    hung = [e for e in failed if e.details.get("cause_class") == CauseClass.hang]
    signalled = [e for e in failed if e.details.get("signal")]
    root = (hung or signalled or failed)[0]
    cause = Cause.of(root.details)
    who = f"rank {root.rank}" if root.rank is not None else "a rank"
    return cause.with_message(f"{who} {cause.message}")


def _record_observations(session: Session, job: Job, attempt: Attempt, view: BackendView) -> None:
    events = []
    for seen in view.events:
        step = None
        if seen.type == EventType.rank_failed and seen.rank is not None:
            step = _last_step(session, job, seen.rank)
        events.append(
            EventIn(
                key=seen.key,
                type=EventType(seen.type),
                attempt=job.attempt,
                rank=seen.rank,
                node=seen.node,
                step=step,
                details=seen.details,
            )
        )
    for n in range(attempt.in_job_restarts + 1, view.in_job_restarts + 1):
        failed_step = lifecycle.note_failure(session, job, attempt)
        known = view.restart_causes[n - 1] if n <= len(view.restart_causes) else None
        cause = known or view.cause or Cause(CauseClass.unknown, "worker group failed")
        events.append(
            EventIn(
                # The trainer reports the same restart under the same key: it is stored once.
                key=f"injob_restart:{job.id}:{job.attempt}:{n}",
                type=EventType.injob_restart,
                attempt=job.attempt,
                step=failed_step,
                details={**cause.details(), "restart_count": n, "failed_step": failed_step, "source": "launcher"},
            )
        )
    attempt.in_job_restarts = max(attempt.in_job_restarts, view.in_job_restarts)
    reporting.record_events(session, job, events)


def _last_step(session: Session, job: Job, rank: int) -> int | None:
    row = session.get(RankLiveness, (job.id, rank))  # one row, not every rank of a 16k-rank job
    return row.step if row is not None and row.attempt == job.attempt else None
