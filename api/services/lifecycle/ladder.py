"""The recovery ladder: its rungs and their budgets in the spec, and `next_rung`, what a failed attempt leads to.

Pure: it reads the job's row and its spec, never the session. The rungs' names and events are
vocabulary (api/schemas/rungs.py); here each rung gets who climbs it and its budget, and nothing else
reads the budgets (the backends and the trainer get theirs from `budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass

from api.database.tables import Job
from api.schemas.causes import Cause, CauseClass
from api.schemas.events import EventType
from api.schemas.rungs import RUNG_EVENTS, RungName
from api.schemas.spec import JobSpec

# Failures in a row that do not get past the step of the first of them: the job is stuck.
NO_PROGRESS_FAILURES = 3
# Causes after which restarting cannot help: the resiliency library already decided, or the attempt's own
# image cannot run it (a launch cause, e.g. EFA asked of an image without the OFI plugin).
FINAL_CAUSES = frozenset({CauseClass.verdict, CauseClass.launch})
# The `reason` fact of a scheduling failure the pending timeout declared (time_out_pending).
PENDING_TIMEOUT = "PendingTimeout"
# Scheduling failures no restart can help: pods no node can ever fit (the kubernetes backend), a job that waited in
# its queue past resiliency.queued_timeout_s (time_out_pending).
QUEUED_TIMEOUT = "QueuedTimeout"
FINAL_REASONS = frozenset({"Unsatisfiable", QUEUED_TIMEOUT})


@dataclass(frozen=True)
class Rung:
    """One rung of the recovery ladder: who climbs it, the event that marks it, its budget in the spec."""

    name: RungName
    runs_in: str  # "trainer" (the ranks' processes), "launcher" (ft_launcher in the pod) or "control plane"

    @property
    def event(self) -> EventType:
        return RUNG_EVENTS[self.name]

    def budget(self, spec: JobSpec) -> int:
        r = spec.resiliency
        if self.name == RungName.inprocess:
            return r.inprocess.max_iterations if r.inprocess.enabled else 0
        if self.name == RungName.in_job:
            return r.max_in_job_restarts
        return r.max_job_restarts


LADDER: tuple[Rung, ...] = (
    Rung(RungName.inprocess, "trainer"),
    Rung(RungName.in_job, "launcher"),
    Rung(RungName.job, "control plane"),
)
RUNG = {rung.name: rung for rung in LADDER}


@dataclass(frozen=True)
class Budgets:
    """Each rung's budget, as the parts that climb a rung themselves are told it."""

    inprocess: int
    in_job: int
    job: int


def budgets(spec: JobSpec) -> Budgets:
    return Budgets(*(rung.budget(spec) for rung in LADDER))


@dataclass(frozen=True)
class Failure:
    """An attempt that is over without success (the rungs inside it are spent), and the nodes it blames."""

    cause: Cause
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Decision:
    """What a failure leads to: the next rung (with the nodes to exclude), or none: give up with `cause`."""

    rung: Rung | None
    cause: Cause
    exclude: tuple[str, ...] = ()

    @property
    def gives_up(self) -> bool:
        return self.rung is None


def next_rung(job: Job, spec: JobSpec, failure: Failure, *, preemptions: int = 0) -> Decision:
    """The escalation after `failure` of the job's current attempt: a job restart, or giving up.

    A preemption (evicted, drained, reclaimed spot capacity, a queue taking the quota back) is not the job's
    fault: its restart comes from a budget of its own, `resiliency.max_preemptions` (`preemptions`: those
    spent so far), and neither spends `max_job_restarts` nor counts as a failure without progress."""
    cause = failure.cause
    if cause.cause_class in FINAL_CAUSES or cause.facts.get("reason") in FINAL_REASONS:
        return Decision(None, cause)
    if cause.facts.get("reason") == PENDING_TIMEOUT and spec.resiliency.on_pending_timeout == "fail":
        return Decision(None, cause.with_message(f"{cause.message}; resiliency.on_pending_timeout is fail"))
    new_nodes = tuple(n for n in dict.fromkeys(failure.nodes) if n and n not in job.excluded_nodes)
    moves = bool(new_nodes) and spec.resiliency.exclude_failed_nodes
    exclude = new_nodes if moves else ()
    rung = RUNG[RungName.job]
    if cause.cause_class == CauseClass.preempted:
        allowed = spec.resiliency.max_preemptions
        if preemptions >= allowed:
            return Decision(None, cause.with_message(f"{cause.message}; preemption budget ({allowed}) spent"))
        return Decision(rung, cause, exclude=exclude)
    stalled = None if moves else progress_stalled(job)  # other hardware is a new condition, not a loop
    if stalled is not None:
        return Decision(None, stalled.with_message(f"{stalled.message} (last cause: {cause.message})"))
    budget = rung.budget(spec)
    if job.job_restarts - preemptions >= budget:
        return Decision(None, cause.with_message(f"{cause.message}; job restart budget ({budget}) spent"))
    return Decision(rung, cause, exclude=exclude)


def progress_stalled(job: Job) -> Cause | None:
    """The last NO_PROGRESS_FAILURES failures never got past the step of the first of them."""
    steps = [int(s) for s in job.failure_steps]
    if len(steps) < NO_PROGRESS_FAILURES:
        return None
    window = steps[-NO_PROGRESS_FAILURES:]
    if max(window[1:]) > window[0]:
        return None
    return Cause(
        CauseClass.no_progress,
        f"no progress: the last {NO_PROGRESS_FAILURES} failures never got past step {window[0]}",
        {"step": window[0]},
    )
