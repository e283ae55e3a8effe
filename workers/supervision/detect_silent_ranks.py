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

The database applies the rule to every rank (`Deadlines.judgement`: a job-wide hang is 131,072 of them) and
hands back one row per node; a hang's ranks are read, one row per node, only the pass it is new. A pass stores
at most `MAX_NEW_HANGS_PER_PASS` new hangs, the longest-silent first, and leaves the rest to the next passes: a
job-wide hang is one hang per node (16,384), which in one pass took longer than the supervision period. Escalation
reads the counts, not the stored hangs, so it is not delayed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from api import models
from api.database.tables import Attempt, Job
from api.models.liveness import QuietKind, SilentGroup, SilentLead, Verdict
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import MAX_EVENTS_PER_BATCH, EventIn, EventType, utcnow
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
# One batch of events a pass: one webhook delivery a pass (announcing the longest-silent nodes first), and a pass
# well within its period at 131,072 ranks; a job-wide hang of 16,384 nodes is stored over 17 passes.
MAX_NEW_HANGS_PER_PASS = MAX_EVENTS_PER_BATCH


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


@dataclass(frozen=True)
class Deadlines:
    """When a quiet rank is silent: its last beat plus the heartbeat timeout; a finishing rank's plus the initial
    timeout; a restarting rank's is the restart's start plus the initial timeout, whenever it last beat."""

    now: datetime
    timeout: timedelta
    initial: timedelta
    restarting_since: datetime | None

    def of(self, kind: str, last_seen: datetime) -> datetime:
        if kind == QuietKind.restarting:
            assert self.restarting_since is not None
            return self.restarting_since + self.initial
        return last_seen + self._allowed(kind)

    def _allowed(self, kind: str) -> timedelta:
        return self.initial if kind == QuietKind.finishing else self.timeout

    def judgement(self, finishing_step: int | None) -> models.liveness.Judgement:
        """The same rule as cut-offs on the last beat, for the database to apply to every rank."""
        silent_before: dict[QuietKind, datetime | None] = {
            kind: self.now - self._allowed(kind) for kind in (QuietKind.running, QuietKind.finishing)
        }
        hung_by = None
        if self.restarting_since is not None:
            overdue = self.of(QuietKind.restarting, self.restarting_since) < self.now
            silent_before[QuietKind.restarting] = self.restarting_since if overdue else None
            # quiet for the timeout when the restart began, as the launcher counts it
            hung_by = self.restarting_since - self.timeout + timedelta(seconds=HUNG_BEFORE_RESTART_TOLERANCE_S)
        return models.liveness.Judgement(self.restarting_since, finishing_step, silent_before, hung_by)


def detect(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> Silence | None:
    now = utcnow()
    timeout = spec.resiliency.heartbeat_timeout_s
    initial = spec.resiliency.initial_heartbeat_timeout_s  # restarting and finishing ranks'
    if not models.liveness.has_attempt(session, job.id, job.attempt):
        if not progress.reports_rank_progress(session, job, spec):
            return detect_silent_nodes(session, job, attempt, spec)
        return _never_heard(session, job, attempt, spec, "no heartbeat from any rank")
    restarting_since = models.events.latest_ts(session, job.id, job.attempt, RESTART_MARKERS)
    deadlines = Deadlines(now, timedelta(seconds=timeout), timedelta(seconds=initial), restarting_since)
    # The database judges every rank (a job-wide hang is 131,072) and counts them per node.
    judgement = deadlines.judgement(job.total_steps)
    groups = models.liveness.silent_groups(session, job.id, job.attempt, judgement)
    if not groups:
        return None

    def cause(lead: SilentLead) -> str:
        quiet = (now - lead.last_seen).total_seconds()
        if lead.verdict == Verdict.recovering:
            assert restarting_since is not None
            before = (restarting_since - lead.last_seen).total_seconds()
            return (
                f"no heartbeat for {before:.1f} s (timeout {timeout:g} s) at step {lead.step} when a restart "
                "began: the launcher is recovering it"
            )
        if lead.kind == QuietKind.restarting:
            assert restarting_since is not None
            return (
                f"no heartbeat {(now - restarting_since).total_seconds():.1f} s after a restart began "
                f"(initial timeout {initial:g} s); last step {lead.step}"
            )
        if lead.kind == QuietKind.finishing:
            return (
                f"no heartbeat for {quiet:.1f} s after the run's last step {lead.step} (initial timeout {initial:g} s)"
            )
        return f"no heartbeat for {quiet:.1f} s (timeout {timeout:g} s) at step {lead.step}"

    recorded = models.events.keys_of_type(session, job.id, job.attempt, EventType.hang_detected.value)
    keyed = ((hang.key(job.attempt), hang) for hang in hangs(groups))
    new = [(key, hang) for key, hang in keyed if key not in recorded]
    new = sorted(new, key=lambda kh: kh[1].earliest)[:MAX_NEW_HANGS_PER_PASS]
    if new:  # each hang's lead and ranks are read (one row per hang)
        among = models.liveness.Groups.of((hang.node, hang.rank) for _, hang in new)
        leads = models.liveness.silent_leads(session, job.id, job.attempt, judgement, among)
        lead_of = {(_group(lead.node, lead.rank), lead.verdict): lead for lead in leads}
        events = []
        for key, hang in new:
            lead = lead_of.get((_group(hang.node, hang.rank), hang.verdict))
            if lead is None:  # it beat again since it was counted
                continue
            quiet = round((now - lead.last_seen).total_seconds(), 3)
            text = cause(lead)
            listed = sorted(int(rank) for rank in lead.listed.split(","))
            if len(listed) > 1:
                text = f"{len(listed)} ranks of node {lead.node} silent, rank {lead.rank} the longest: {text}"
            ranks = listed if len(listed) > 1 else None
            events.append(_event(job, lead.rank, lead.step, key, text, lead.node, quiet, ranks))
        reporting.record_events(session, job, events)
    silent = [g for g in groups if g.verdict == Verdict.silent]
    if not silent:
        return None
    worst = (now - min(g.earliest for g in silent)).total_seconds()
    overdue = max((now - deadlines.of(g.kind, g.earliest)).total_seconds() for g in silent)
    summary = f"{sum(g.ranks for g in silent)} rank(s) silent for up to {worst:.1f} s (timeout {timeout:g} s)"
    blamed = tuple(sorted({g.node for g in silent if g.node}))
    if len(blamed) >= spec.nodes:  # every node has a silent rank: no one node is to blame
        blamed = ()
    if blamed:
        summary += f" on node(s) {', '.join(blamed)}"
    return Silence(summary, escalate=overdue > timeout, silent_s=round(worst, 3), nodes=blamed)


@dataclass(frozen=True)
class Hang:
    """One hang to record: a node's silent ranks with one verdict (a rank without a node is its own), since the
    oldest last beat among them. A job-wide hang of 131,072 ranks is 16,384 hangs, not 131,072."""

    node: str | None
    rank: int | None  # of a hang without a node
    verdict: str  # a Verdict
    earliest: datetime

    def key(self, attempt: int) -> str:
        """Its idempotency key: a node's later-silent ranks found on a later pass add nothing to its hang."""
        who = f"n{hashlib.sha256(self.node.encode()).hexdigest()[:16]}" if self.node is not None else f"r{self.rank}"
        return f"hang:a{attempt}:{who}:t{int(self.earliest.timestamp() * 1000)}"


def _group(node: str | None, rank: int | None) -> str | int | None:
    """What a hang is of: its node, or its rank where it has none."""
    return node if node is not None else rank


def hangs(groups: Iterable[SilentGroup]) -> list[Hang]:
    """The groups of a node's ranks of every kind, as one hang per node and verdict."""
    earliest: dict[tuple[str | None, int | None, str], datetime] = {}
    for g in groups:
        at = earliest.get((g.node, g.rank, g.verdict))
        earliest[(g.node, g.rank, g.verdict)] = g.earliest if at is None else min(at, g.earliest)
    return [Hang(node, rank, verdict, at) for (node, rank, verdict), at in earliest.items()]


def detect_silent_nodes(session: Session, job: Job, attempt: Attempt, spec: JobSpec) -> Silence | None:
    """Node-level: an agent that stopped reporting while the job's other agents report is a lost node. (When every
    agent is silent, the control plane or the network is the likelier cause; the backend sees a node that is gone.)"""
    now = utcnow()
    timeout = spec.resiliency.heartbeat_timeout_s
    rows = models.nodes.last_seen_of_attempt(session, job.id, job.attempt)
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
