"""Duty: reconcile each launched attempt with its backend.

The backend's view (pods, launcher processes) is read off the database transaction, on a small
thread pool, and a pass waits for those reads at most READ_WAIT_S: a slow or failing read (a
Kubernetes API retried for many seconds) delays only its own job, whose result is applied by a
later pass. Each result is then applied under the job's row lock, if the job is still on the
attempt that was read: what the backend saw is recorded (rank failures, in-job restarts and their
causes), and an attempt that is over ends through the lifecycle (success, or the next rung).

A node the backend has lost touch with (its kubelet NotReady or unreachable, its pods' phase Unknown) whose node
agent still reports to ftplane is alive: its containers are training. Its attempt does not end for that while the
agent's newest report is fresher than AGENT_VOUCHES_INTERVALS report intervals.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime

from sqlalchemy.orm import Session

from api import models
from api.core.killpoints import kill_point
from api.database.tables import Attempt, Job, NodeLiveness, RankLiveness
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType
from api.schemas.spec import JobSpec
from api.services import lifecycle
from api.services.ingest import reporting
from api.services.lifecycle import AttemptStatus, JobStatus
from ftplane import contract
from workers import backends
from workers.backends.base import AttemptPhase, AttemptReading
from workers.supervision.batch import for_each_job

log = logging.getLogger(__name__)

READ_WAIT_S = 1.0
READ_THREADS = 8
AGENT_VOUCHES_INTERVALS = 3
LOST_TOUCH = frozenset({"NodeUnreachable", "NodeNotReady", "NodeLost"})  # the backend's reasons for a node it lost

Target = tuple[str, int]  # (job id, attempt number)


class BackendReads:
    """Backend status reads in flight, at most one per attempt."""

    def __init__(self, threads: int = READ_THREADS) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="backend-read")
        self._in_flight: dict[Target, Future[AttemptReading]] = {}

    def start(self, target: Target, backend_name: str, spec: JobSpec) -> None:
        if target not in self._in_flight:
            job_id, attempt = target
            backend = backends.get_backend(backend_name)
            self._in_flight[target] = self._pool.submit(backend.status, job_id, attempt, spec)

    def collect(self, timeout: float) -> dict[Target, AttemptReading]:
        """Wait up to `timeout` for the reads in flight; returns those that finished (and forgets them)."""
        wait(list(self._in_flight.values()), timeout=timeout)
        done: dict[Target, AttemptReading] = {}
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
    job_ids = models.jobs.with_current_attempt_in(session, [AttemptStatus.LAUNCHED, AttemptStatus.RUNNING])
    for job_id in job_ids:
        job = models.jobs.get(session, job_id)
        if job is not None:
            reads.start((job.id, job.attempt), job.backend, lifecycle.spec_of(job))
    session.commit()  # no transaction stays open while the reads run
    results = reads.collect(wait_s)

    def apply(session: Session, job: Job) -> None:
        view = results.get((job.id, job.attempt))  # None: the job moved on to another attempt meanwhile
        if view is not None:
            _apply(session, job, view)

    return for_each_job(session, [job_id for job_id, _ in results], apply, "reconcile")


def _apply(session: Session, job: Job, view: AttemptReading) -> None:
    """Record what the backend saw of the job's current attempt and act on its phase (a failure climbs the
    ladder: lifecycle.attempt_failed hands a job restart's launch on)."""
    if JobStatus(job.status) in lifecycle.TERMINAL or job.cancel_requested:
        return
    attempt = lifecycle.current_attempt(session, job)
    if attempt.status not in (AttemptStatus.LAUNCHED, AttemptStatus.RUNNING):
        return
    if view.phase == AttemptPhase.failed and view.cause is not None and _agent_vouches(session, job, view.cause):
        node = view.cause.facts.get("node")
        attempt.cause = f"{view.cause.message}; its node agent still reports, so its pods are taken to be training"
        view.events = [e for e in view.events if e.node != node]  # nothing of its loss is recorded
        _record_observations(session, job, attempt, view)
        return
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
        blamed = models.events.nodes_named(
            session, job.id, job.attempt, [EventType.node_unhealthy, EventType.node_failed]
        )
        failure = lifecycle.Failure(cause, tuple(dict.fromkeys([*view.failed_nodes, *blamed])))
        lifecycle.attempt_failed(session, job, attempt, failure)


def _agent_vouches(session: Session, job: Job, cause: Cause) -> bool:
    """Whether the node the backend lost touch with still reports through its agent (see the module's docstring)."""
    node = cause.facts.get("node")
    if cause.facts.get("reason") not in LOST_TOUCH or not node:
        return False
    row = session.get(NodeLiveness, (job.id, str(node)))
    if row is None or row.attempt != job.attempt:
        return False
    seen = row.last_seen if row.last_seen.tzinfo else row.last_seen.replace(tzinfo=UTC)
    fresh_s = AGENT_VOUCHES_INTERVALS * lifecycle.spec_of(job).report_interval_s
    return (datetime.now(UTC) - seen).total_seconds() <= fresh_s


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
    as `contract.root_cause` picks it; the rest are collateral."""
    since = models.events.latest_ts(session, job.id, job.attempt, [EventType.injob_restart])
    failed = [
        e
        for e in models.events.of_job(session, job.id, types=[EventType.rank_failed.value])
        if e.attempt == job.attempt and (since is None or e.ts >= since) and e.details.get("cause")
    ]
    root = contract.root_cause(
        failed,
        hung=lambda e: e.details.get("cause_class") == CauseClass.hang,
        signal=lambda e: e.details.get("signal"),
        consequence=lambda e: e.details.get("consequence") is True,
    )
    if root is None:
        last = models.events.latest(session, job.id, job.attempt, [EventType.injob_restart])
        return Cause.of(last.details) if last is not None and last.details.get("cause") else None
    cause = Cause.of(root.details)
    who = f"rank {root.rank}" if root.rank is not None else "a rank"
    return cause.with_message(f"{who} {cause.message}")


def _record_observations(session: Session, job: Job, attempt: Attempt, view: AttemptReading) -> None:
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
    for restart in lifecycle.in_job_restarts_seen(session, job, attempt, view.in_job_restarts):
        n, step = restart.number, restart.failed_step
        known = view.restart_causes[n - 1] if n <= len(view.restart_causes) else None
        cause = known or view.cause or Cause(CauseClass.unknown, "worker group failed")
        events.append(
            EventIn(
                # The trainer reports the same restart under the same key: it is stored once.
                key=contract.injob_restart_key(job.id, job.attempt, n),
                type=EventType.injob_restart,
                attempt=job.attempt,
                step=step,
                details={**cause.details(), "restart_count": n, "failed_step": step, "source": "launcher"},
            )
        )
    reporting.record_events(session, job, events)


def _last_step(session: Session, job: Job, rank: int) -> int | None:
    row = session.get(RankLiveness, (job.id, rank))  # one row, not every rank of a 16k-rank job
    return row.step if row is not None and row.attempt == job.attempt else None
