"""The small interface every execution backend implements, and the trainer's environment.

A backend launches one *attempt* of a job (a set of ft_launcher processes, or
pods), reports what it observes about that attempt, injects faults into it and
tears it down. Decisions (restart, give up) are not a backend's business: the
supervisor takes them through the lifecycle module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from api.schemas.causes import Cause
from api.schemas.spec import JobSpec
from api.services import lifecycle


class AttemptPhase(StrEnum):
    pending = "pending"  # accepted by the backend, not yet running (pods scheduling)
    running = "running"
    succeeded = "succeeded"
    failed = "failed"  # ended without success; `cause` says why
    missing = "missing"  # the backend knows nothing of this attempt


@dataclass(frozen=True)
class LaunchRequest:
    """Everything a backend needs to start attempt `attempt` of a job."""

    job_id: str
    attempt: int
    spec: JobSpec
    token: str  # the job-scoped trainer token (a secret: never logged, never in a manifest)
    control_plane_url: str
    excluded_nodes: tuple[str, ...] = ()


@dataclass
class ObservedEvent:
    """Something the backend saw, to be stored as an event (idempotent by key). A failure's `details` carry
    its `Cause.details()`."""

    key: str
    type: str
    rank: int | None = None
    node: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class AttemptStatus:
    phase: AttemptPhase
    cause: Cause | None = None  # why it failed (or, while running, the latest failure seen)
    in_job_restarts: int = 0  # restarts the in-pod launcher has made so far
    restart_causes: tuple[Cause, ...] = ()  # the cause of each of those restarts, in order, where known
    failed_nodes: tuple[str, ...] = ()
    events: list[ObservedEvent] = field(default_factory=list)


class Backend(Protocol):
    name: str
    # Whether a new attempt can avoid the nodes the lifecycle excluded (the local backend cannot: every node
    # runs on this machine).
    can_exclude_nodes: bool

    def render(self, request: LaunchRequest) -> str:
        """What `launch` would start, as text (YAML manifests, a command line), without starting it."""
        ...

    def launch(self, request: LaunchRequest) -> None:
        """Start the attempt. Idempotent: launching an attempt that already exists is a no-op."""
        ...

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptStatus: ...

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Tear the attempt down entirely. Idempotent."""
        ...

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """The job is over: remove what outlives single attempts. Idempotent."""
        ...


def trainer_environment(request: LaunchRequest) -> dict[str, str]:
    """The variables every backend gives the trainer (its only configuration besides `command`).

    The token is deliberately absent: each backend passes it its own way
    (process environment for local, a Secret reference on Kubernetes).
    """
    spec = request.spec
    budgets = lifecycle.budgets(spec)
    env = dict(spec.env)
    env.update(
        {
            "FTPLANE_URL": request.control_plane_url,
            "FTPLANE_JOB_ID": request.job_id,
            "FTPLANE_ATTEMPT": str(request.attempt),
            "FTPLANE_CHECKPOINT_ENGINE": spec.checkpoint.engine,
            "FTPLANE_CHECKPOINT_INTERVAL": str(spec.checkpoint.interval_steps),
            "FTPLANE_CHECKPOINT_KEEP": str(spec.checkpoint.keep),
            "FTPLANE_INPROCESS": "1" if budgets.inprocess else "0",
            "FTPLANE_FAULTS": json.dumps([f.model_dump() for f in spec.faults]),
        }
    )
    if budgets.inprocess:
        inprocess = spec.resiliency.inprocess
        env["FTPLANE_INPROCESS_SOFT_TIMEOUT_S"] = str(inprocess.soft_timeout_s)
        env["FTPLANE_INPROCESS_HARD_TIMEOUT_S"] = str(inprocess.hard_timeout_s)
        env["FTPLANE_INPROCESS_MAX_ITERATIONS"] = str(budgets.inprocess)
    if spec.checkpoint.dir:
        env["FTPLANE_CHECKPOINT_DIR"] = spec.checkpoint.dir
    return env


def agent_environment(request: LaunchRequest) -> dict[str, str]:
    """What the node agent reads besides the trainer's variables (which it passes on to the ranks)."""
    env = trainer_environment(request)
    progress = request.spec.progress
    if progress.log_pattern:
        env["FTPLANE_LOG_PATTERN"] = progress.log_pattern
    env["FTPLANE_REPORT_INTERVAL_S"] = str(request.spec.report_interval_s)
    return env


def launcher_arguments(
    spec: JobSpec,
    *,
    nnodes: int | str,
    rdzv_endpoint: str,
    rdzv_id: str,
    log_dir: str | None = None,
    extra: list[str] | None = None,
) -> list[str]:
    """The `ft_launcher` command line shared by the backends (flags common to NVRx 0.4 and 0.7).

    The ranks' output is teed (`--tee=3`): the node agent reads each rank's lines from the launcher's
    output, and keeps a copy per rank under `log_dir`.
    """
    r = spec.resiliency
    in_job_budget = lifecycle.budgets(spec).in_job
    teed = ["--tee=3", f"--log-dir={log_dir}"] if log_dir else ["--tee=3"]
    return [
        "ft_launcher",
        f"--nnodes={nnodes}",
        f"--nproc-per-node={spec.procs_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--max-restarts={in_job_budget}",
        f"--ft-initial-rank-heartbeat-timeout={r.initial_heartbeat_timeout_s}",
        f"--ft-rank-heartbeat-timeout={r.heartbeat_timeout_s}",
        "--ft-restart-policy=any-failed",
        "--monitor-interval=1",
        *teed,
        *(extra or []),
        "--no-python",  # the spec's command is a full command line, not a script for the launcher's Python
        *spec.command,
    ]
