"""Duty: detect ranks that stopped heartbeating: hang_detected past the spec's timeout.

It reads the database only (rank liveness and events), so it never waits on a backend: a hang is
found while the cluster's API cannot be read. It watches attempts that were seen running.

The in-pod launcher restarts a hung rank on its own (same timeouts); when a hang
outlives twice the timeout, the launcher could not recover it and the
supervisor escalates to a job-level restart. The escalation blames the silent ranks' nodes (the
next attempt avoids them), unless every node of the job has a silent rank: a hang of the whole job
is the program's or the network's, not one node's.

A rank that has not beaten since a failure or restart was reported is not hung but
restarting: like ft_launcher after it restarts workers, it gets the initial timeout,
counted from that report (processes must start, import, load a checkpoint).

Unless it was already silent for the timeout when that report came: the launcher
shares the timeout and may restart a hung rank (the report) before a pass of this
supervisor sees it overdue. Such a rank hung; its hang is recorded (once, like any
other) but not escalated: the launcher is recovering it.

A rank that reported the run's last step is finishing (its last checkpoint, the process
group's teardown, the exit), which on a loaded node takes longer than a step: it too gets
the initial timeout, counted from its last beat. A rank that hangs on its way out is still found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Attempt, Job
from api.models.liveness import QuietRank
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventIn, EventType, utcnow
from api.schemas.spec import JobSpec
from api.services import lifecycle, progress
from api.services.ingest import reporting
from api.services.lifecycle import AttemptStatus
from workers.supervision.batch import for_each_job

# Reports after which ranks are expected to go quiet for a while: they are being restarted.
RESTART_MARKERS = (EventType.rank_failed, EventType.inprocess_restart, EventType.injob_restart)
# The launcher acts on the timeout counted from the same heartbeat, on another clock: a rank silent for the
# timeout less this when a restart began was hung.
HUNG_BEFORE_RESTART_TOLERANCE_S = 1.0


@dataclass(frozen=True)
class Silence:
    cause: str
    escalate: bool  # silent for twice the timeout: in-job recovery did not work
    silent_s: float
    nodes: tuple[str, ...] = ()  # the silent ranks' nodes, when they are not all of the job's
    cause_class: CauseClass = CauseClass.hang  # node: a node agent went silent (zero-code jobs)


def run_once(session: Session) -> int:
    return for_each_job(session, models.jobs.with_current_attempt_in(session, [AttemptStatus.RUNNING]), check, "detect")


def check(session: Session, job: Job) -> None:
    """Record the job's silent ranks; a silence the launcher did not recover climbs the ladder."""
    attempt = lifecycle.current_attempt(session, job)
    if attempt.status != AttemptStatus.RUNNING:
        return
    lifecycle.highest_step(session, job, attempt)
    silence = detect(session, job, attempt, lifecycle.spec_of(job))
    if silence is None or not silence.escalate:
        return
    text = f"hang not recovered in-job: {silence.cause}" if silence.cause_class == CauseClass.hang else silence.cause
    cause = Cause(silence.cause_class, text, {"silent_s": silence.silent_s})
    lifecycle.attempt_failed(session, job, attempt, lifecycle.Failure(cause, silence.nodes))


def detect(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> Silence | None:
    now = utcnow()
    timeout = spec.resiliency.heartbeat_timeout_s
    initial = spec.resiliency.initial_heartbeat_timeout_s  # restarting and finishing ranks'
    if not models.liveness.has_attempt(session, job.id, job.attempt):
        if not progress.reports_rank_progress(session, job, spec):
            return detect_silent_nodes(session, job, attempt, spec)
        return _never_heard(session, job, attempt, spec, "no heartbeat from any rank")
    restarting_since = models.events.latest_ts(session, job.id, job.attempt, RESTART_MARKERS)

    def restarting(rank: QuietRank) -> bool:
        return restarting_since is not None and restarting_since > rank.last_seen

    def hung_before_restart(rank: QuietRank) -> bool:
        assert restarting_since is not None
        return (restarting_since - rank.last_seen).total_seconds() >= timeout - HUNG_BEFORE_RESTART_TOLERANCE_S

    total_steps = job.total_steps
    # per rank, for every quiet rank of a job-wide hang (131,072): the spans are made once
    restarted_deadline = restarting_since + timedelta(seconds=initial) if restarting_since is not None else None
    timeout_span, initial_span = timedelta(seconds=timeout), timedelta(seconds=initial)

    def finishing(rank: QuietRank) -> bool:
        return total_steps is not None and rank.step >= total_steps

    def deadline(rank: QuietRank) -> datetime:
        if restarted_deadline is not None and restarting(rank):
            return restarted_deadline
        return rank.last_seen + (initial_span if finishing(rank) else timeout_span)

    # Only ranks quiet for the shorter of the two timeouts can be silent: read those alone (a 16k-rank job's
    # rows are not loaded every pass), and skip the silences already recorded (their keys are stored).
    shortest = min(timeout, initial)
    quiet_ranks = models.liveness.stale_ranks(session, job.id, job.attempt, now - timedelta(seconds=shortest))
    due = [(r, deadline(r)) for r in quiet_ranks]
    silent = [r for r, at in due if at < now]
    hung_then_restarted = [r for r, at in due if at >= now and restarting(r) and hung_before_restart(r)]
    if not silent and not hung_then_restarted:
        return None

    def cause(rank: QuietRank, recovering: bool) -> str:
        quiet = (now - rank.last_seen).total_seconds()
        if recovering:
            assert restarting_since is not None
            before = (restarting_since - rank.last_seen).total_seconds()
            return (
                f"no heartbeat for {before:.1f} s (timeout {timeout:g} s) at step {rank.step} when a restart "
                "began: the launcher is recovering it"
            )
        if restarting(rank):
            assert restarting_since is not None
            return (
                f"no heartbeat {(now - restarting_since).total_seconds():.1f} s after a restart began "
                f"(initial timeout {initial:g} s); last step {rank.step}"
            )
        if finishing(rank):
            return (
                f"no heartbeat for {quiet:.1f} s after the run's last step {rank.step} (initial timeout {initial:g} s)"
            )
        return f"no heartbeat for {quiet:.1f} s (timeout {timeout:g} s) at step {rank.step}"

    recorded = models.events.keys_of_type(session, job.id, job.attempt, EventType.hang_detected.value)
    events = []
    for recovering, ranks in ((False, silent), (True, hung_then_restarted)):
        for hung in hangs(ranks):
            lead = hung[0]
            key = f"hang:a{job.attempt}:r{lead.rank}:t{int(lead.last_seen.timestamp() * 1000)}"
            if key in recorded:
                continue
            quiet = round((now - lead.last_seen).total_seconds(), 3)
            text = cause(lead, recovering)
            if len(hung) > 1:
                text = f"{len(hung)} ranks of node {lead.node} silent, rank {lead.rank} the longest: {text}"
            ranks_of_node = sorted(r.rank for r in hung) if len(hung) > 1 else None
            events.append(_event(job, lead.rank, lead.step, key, text, lead.node, quiet, ranks_of_node))
    reporting.record_events(session, job, events)
    if not silent:
        return None
    worst = (now - min(r.last_seen for r in silent)).total_seconds()
    overdue = (now - min(at for _, at in due if at < now)).total_seconds()
    summary = f"{len(silent)} rank(s) silent for up to {worst:.1f} s (timeout {timeout:g} s)"
    blamed = tuple(sorted({r.node for r in silent if r.node}))
    if len(blamed) >= spec.nodes:  # every node has a silent rank: no one node is to blame
        blamed = ()
    if blamed:
        summary += f" on node(s) {', '.join(blamed)}"
    return Silence(summary, escalate=overdue > timeout, silent_s=round(worst, 3), nodes=blamed)


def hangs(ranks: Sequence[QuietRank]) -> list[list[QuietRank]]:
    """The hangs to record for these silent ranks: one per node (a job-wide hang of 131,072 ranks is 16,384 events,
    not 131,072), a rank without a node on its own; each led by its longest-silent rank, whose key it takes, so a
    node's later-silent ranks found on a later pass add nothing to the hang already recorded."""
    by_node: dict[tuple[str | None, int | None], list[QuietRank]] = {}
    for rank in ranks:
        by_node.setdefault((rank.node, None) if rank.node else (None, rank.rank), []).append(rank)
    return [sorted(group, key=lambda r: (r.last_seen, r.rank)) for group in by_node.values()]


def detect_silent_nodes(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> Silence | None:
    """Node-level: an agent that stopped reporting while the job's other agents report is a lost node. (When every
    agent is silent, the control plane or the network is the likelier cause; the backend sees a node that is gone.)"""
    now = utcnow()
    timeout = spec.resiliency.heartbeat_timeout_s
    rows = models.nodes.of_attempt(session, job.id, job.attempt)
    if not rows:
        return _never_heard(session, job, attempt, spec, "no report from any node agent")
    silent = [row for row in rows if (now - row.last_seen).total_seconds() > timeout]
    if not silent or len(silent) == len(rows):
        return None
    recorded = models.events.keys_of_type(session, job.id, job.attempt, EventType.heartbeat_lost.value)
    events = []
    for row in silent:
        quiet = round((now - row.last_seen).total_seconds(), 3)
        key = f"node_silent:a{job.attempt}:{row.node}:t{int(row.last_seen.timestamp() * 1000)}"
        if key in recorded:
            continue
        lost = Cause(
            CauseClass.node,
            f"no report from node {row.node}'s agent for {quiet:.1f} s (timeout {timeout:g} s)",
            {"node": row.node, "silent_s": quiet},
        )
        events.append(
            EventIn(key=key, type=EventType.heartbeat_lost, attempt=job.attempt, node=row.node, details=lost.details())
        )
    reporting.record_events(session, job, events)
    worst = max((now - row.last_seen).total_seconds() for row in silent)
    names = tuple(sorted(row.node for row in silent))
    summary = f"node(s) {', '.join(names)} silent for up to {worst:.1f} s (timeout {timeout:g} s)"
    return Silence(
        f"node lost: {summary}", worst > 2 * timeout, round(worst, 3), nodes=names, cause_class=CauseClass.node
    )


def _never_heard(session: Session, job: Job, attempt: Attempt, spec: JobSpec, what: str) -> Silence | None:
    """Nothing heard from the attempt past the initial timeout, counted from when its processes could first report:
    it started running (a queue's wait, image pulls and scheduling before that are no silence), or its launch when
    the backend never said so."""
    since = attempt.started_at or attempt.launched_at
    if since is None:
        return None
    waited = (utcnow() - since).total_seconds()
    initial = spec.resiliency.initial_heartbeat_timeout_s
    if waited <= initial:
        return None
    cause = f"{what} {waited:.1f} s after the pods started (initial timeout {initial:g} s)"
    # no silent_s: nothing ran yet, so the hang has no onset before its detection (goodput counts the wait as
    # initialization)
    reporting.record_events(session, job, [_event(job, None, None, f"hang:a{job.attempt}:initial", cause)])
    return Silence(cause, escalate=waited > 2 * initial, silent_s=round(waited, 3))


def _event(
    job: Job,
    rank: int | None,
    step: int | None,
    key: str,
    cause: str,
    node: str | None = None,
    silent_s: float | None = None,
    ranks: list[int] | None = None,
) -> EventIn:
    # silent_s: how long the (longest-silent) rank had been quiet (goodput dates the hang's onset by it);
    # ranks: every silent rank of the node, where there are several
    facts: dict[str, object] = {"rank": rank} if rank is not None else {}
    if ranks is not None:
        facts["ranks"] = ranks
    if silent_s is not None:
        facts["silent_s"] = silent_s
    return EventIn(
        key=key,
        type=EventType.hang_detected,
        attempt=job.attempt,
        rank=rank,
        step=step,
        node=node,
        details=Cause(CauseClass.hang, cause, facts).details(),
    )
