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
from ftplane import contract
from workers.backends.checkpoint_storage import CheckpointPaths, on_shared_directory


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
    # The fleet's quarantined nodes (api/services/node_reputation): no pod or process of the attempt goes there.
    quarantined_nodes: tuple[str, ...] = ()


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
class AttemptReading:
    """What a backend reads of one attempt where it runs (not the API's `AttemptStatus`, kept by the lifecycle)."""

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

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptReading: ...

    def stop(self, job_id: str, attempt: int, spec: JobSpec) -> bool:
        """Start tearing the attempt down and return at once: True once nothing of it runs any more. Called again
        (by any worker, on a later pass) until it says so; the backend's own grace ends in a kill. Idempotent."""
        ...

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        """Tear the attempt down entirely, waiting for it where the backend must. Idempotent."""
        ...

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        """The job is over: remove what outlives single attempts. Idempotent."""
        ...


def trainer_environment(request: LaunchRequest, checkpoints: CheckpointPaths | None = None) -> dict[str, str]:
    """The variables every backend gives the trainer (its only configuration besides `command`).

    The token is deliberately absent: each backend passes it its own way
    (process environment for local, a Secret reference on Kubernetes). `checkpoints`: where the job's
    checkpoints are in its pods or processes (default: under `checkpoint.dir`, checkpoint_storage). The spec's
    `env` is not among them but in FTPLANE_RANK_ENV (JSON), which the node agent gives the ranks only: the
    agent itself runs with its own environment (a user's PYTHONPATH or LD_PRELOAD is the ranks' business).
    """
    spec = request.spec
    budgets = lifecycle.budgets(spec)
    env: dict[str, str] = {}
    if spec.env:
        env[contract.Env.RANK_ENV] = json.dumps(spec.env)
    env.update(
        {
            contract.Env.URL: request.control_plane_url,
            contract.Env.JOB_ID: request.job_id,
            contract.Env.ATTEMPT: str(request.attempt),
            contract.Env.CHECKPOINT_ENGINE: spec.checkpoint.engine,
            contract.Env.CHECKPOINT_INTERVAL: str(spec.checkpoint.interval_steps),
            contract.Env.CHECKPOINT_KEEP: str(spec.checkpoint.keep),
            contract.Env.INPROCESS: "1" if budgets.inprocess else "0",
            contract.Env.FAULTS: json.dumps([f.model_dump() for f in spec.faults]),
        }
    )
    if budgets.inprocess:
        inprocess = spec.resiliency.inprocess
        env[contract.Env.INPROCESS_SOFT_TIMEOUT_S] = str(inprocess.soft_timeout_s)
        env[contract.Env.INPROCESS_HARD_TIMEOUT_S] = str(inprocess.hard_timeout_s)
        env[contract.Env.INPROCESS_MAX_ITERATIONS] = str(budgets.inprocess)
    paths = checkpoints or on_shared_directory(spec, request.job_id)
    if paths.directory:
        env[contract.Env.CHECKPOINT_DIR] = paths.directory
    if paths.resume_from:
        env[contract.Env.CHECKPOINT_RESUME_FROM] = paths.resume_from
    return env


def agent_environment(request: LaunchRequest, checkpoints: CheckpointPaths | None = None) -> dict[str, str]:
    """What the node agent reads besides the trainer's variables (which it passes on to the ranks)."""
    env = trainer_environment(request, checkpoints)
    progress = request.spec.progress
    if progress.log_pattern:
        env[contract.Env.LOG_PATTERN] = progress.log_pattern
    if progress.preset:
        env[contract.Env.PROGRESS_PRESET] = progress.preset
    env[contract.Env.REPORT_INTERVAL_S] = str(request.spec.report_interval_s)
    if request.spec.secret_env:  # the agent redacts their values from every line that leaves the node
        env[contract.Env.SECRET_ENV] = ",".join(sorted(request.spec.secret_env))
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
