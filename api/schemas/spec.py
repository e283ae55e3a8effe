"""The job spec: the body of `POST /v1/jobs` and the YAML users write.

Unknown keys are refused everywhere (extra="forbid") so a typo is an error
naming the key, never a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from api.schemas.kubernetes_spec import (
    HugePageSize,
    LabelValue,
    QueueName,
    SchedulingSpec,
    SecretKeyRef,
    check_hugepages,
    keys_match_pattern,
    kubernetes_only_fields,
)
from api.schemas.scalars import JsonInt

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"

DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=LABEL_KEY)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME)]
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=QUANTITY)]


# Variables the backends set for the trainer; a spec may not override them.
RESERVED_ENV_PREFIX = "FTPLANE_"


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Resources(StrictModel):
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    efa_per_node: int = Field(default=0, ge=0, le=64)
    cpu: Quantity | None = None
    memory: Quantity | None = None
    shm: Quantity | None = Field(default=None, description="Size of the /dev/shm memory volume (kubernetes).")
    hugepages: dict[HugePageSize, Quantity] = Field(
        default_factory=dict,
        description="Huge pages per node by page size, e.g. {'2Mi': '5120Mi'} for EFA (kubernetes; requests = limits).",
    )

    @model_validator(mode="after")
    def _hugepages_with_cpu_or_memory(self) -> Resources:
        check_hugepages(self.hugepages, self.cpu, self.memory)
        return self


class CheckpointSpec(StrictModel):
    dir: str | None = Field(default=None, max_length=1024, description="Shared checkpoint directory.")
    interval_steps: int = Field(default=100, ge=1, le=10**9)
    engine: Literal["async", "sync", "none"] = "sync"
    keep: int = Field(default=2, ge=1, le=1000, description="Complete checkpoints kept on disk.")
    pvc: DnsLabel | None = Field(default=None, description="PersistentVolumeClaim holding dir (kubernetes).")


class InprocessSpec(StrictModel):
    enabled: bool = False
    soft_timeout_s: float = Field(default=60, gt=0, le=86400)
    hard_timeout_s: float = Field(default=90, gt=0, le=86400)
    max_iterations: int = Field(default=10, ge=1, le=10_000, description="In-process restarts per process.")

    @model_validator(mode="after")
    def _hard_after_soft(self) -> InprocessSpec:
        if self.hard_timeout_s <= self.soft_timeout_s:
            raise ValueError("hard_timeout_s must be greater than soft_timeout_s")
        return self


MAX_LOG_PATTERN = 512
MAX_LOCAL_NODES = 8
# Node reports per second one job may send: past that many nodes, each node reports less often.
REPORTS_PER_JOB_S = 256
MAX_REPORT_INTERVAL_S = 30.0
# A heartbeat timeout must cover this many report intervals, so a late report or two is not a hang.
TIMEOUT_INTERVALS = 3


def default_report_interval(nodes: int) -> float:
    """1 s per node up to REPORTS_PER_JOB_S nodes; then longer, so the job stays within that many reports a second."""
    return min(MAX_REPORT_INTERVAL_S, max(1.0, nodes / REPORTS_PER_JOB_S))


class ProgressSpec(StrictModel):
    """How ftplane learns each rank's progress when the training code does not use the SDK."""

    log_pattern: str | None = Field(
        default=None,
        max_length=MAX_LOG_PATTERN,
        description="A regular expression with a named group `step`, matched against each rank's output lines "
        r"(e.g. 'step (?P<step>\d+)'): each match is that rank's heartbeat at that step.",
    )
    report_interval_s: float | None = Field(
        default=None,
        ge=0.1,
        le=MAX_REPORT_INTERVAL_S,
        description="How often each node's agent reports. Default: 1 s, longer past "
        f"{REPORTS_PER_JOB_S} nodes (the job then sends at most {REPORTS_PER_JOB_S} reports a second).",
    )

    @field_validator("log_pattern")
    @classmethod
    def _pattern_has_a_step(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"does not compile: {exc}") from None
            if "step" not in compiled.groupindex:
                raise ValueError(r"needs a named group 'step', e.g. 'step (?P<step>\d+)'")
        return pattern


class StragglerSpec(StrictModel):
    """Straggler detection (workers/supervision/detect_stragglers.py): each rank's pace against the job's."""

    enabled: bool = True
    threshold: float = Field(
        default=0.85,
        gt=0,
        lt=1,
        description="A rank straggles when its score (the job's pace over the rank's: 1 keeps up, 0.5 takes twice "
        "as long per step) stays below this over the window (its median there).",
    )
    window_s: float = Field(
        default=300,
        ge=1,
        le=86400,
        description="Seconds of scores a rank is judged on; at least 3 node report intervals.",
    )
    action: Literal["alert", "exclude"] = Field(
        default="alert",
        description="alert: straggler_detected (and its webhook) only; exclude: also, once an episode lasts "
        "exclude_after_s, restart the job without the straggler's node (max_job_restarts and "
        "exclude_failed_nodes apply as for a failed node).",
    )
    exclude_after_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86400,
        description="With action exclude: how long an episode lasts before the node is excluded (default window_s).",
    )


class AnomalySpec(StrictModel):
    """Restart anomalies of the job as a whole (workers/supervision/detect_restart_anomalies.py)."""

    enabled: bool = True
    storm_restarts: int = Field(default=5, ge=2, le=10_000, description="restart_storm: this many restarts ...")
    storm_window_s: float = Field(default=1800, ge=10, le=7 * 86400, description="... within this many seconds.")
    stalled_cycles: int = Field(
        default=3,
        ge=2,
        le=1000,
        description="progress_stalled: this many restarts in a row without the newest checkpoint moving forward.",
    )
    cycle_timeout_s: float = Field(
        default=3600,
        ge=10,
        le=7 * 86400,
        description="recovery_stuck: a restart after which training has not resumed for this long (queue waits "
        "excluded).",
    )


class ResiliencySpec(StrictModel):
    inprocess: InprocessSpec = Field(default_factory=InprocessSpec)
    max_in_job_restarts: int = Field(default=3, ge=0, le=10_000)
    max_job_restarts: int = Field(default=1, ge=0, le=1000)
    initial_heartbeat_timeout_s: float = Field(default=1200, gt=0, le=86400)
    heartbeat_timeout_s: float = Field(default=300, gt=0, le=86400)
    exclude_failed_nodes: bool = True
    pending_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=7 * 86400,
        description="Give up on an attempt that has not started running this long after its launch "
        "(pods unschedulable, image not pulled); it counts as a failure of the attempt. None: wait forever. "
        "Time spent waiting in a Kueue queue does not count.",
    )
    on_pending_timeout: Literal["retry", "fail"] = Field(
        default="retry",
        description="What a pending timeout leads to: retry (a job restart, from max_job_restarts) or fail the job.",
    )
    max_preemptions: int = Field(
        default=10,
        ge=0,
        le=1000,
        description="Job restarts after a preemption (eviction, node drain, spot interruption, Kueue preemption): "
        "a budget of its own, not counted against max_job_restarts.",
    )
    spare_nodes: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Hot spares (kubernetes): the job runs nodes + spare_nodes pods; ft_launcher keeps `nodes` "
        "active and the rest standing by, so a lost node is replaced in-job. Needs NVRx >= 0.6 in the image.",
    )
    stragglers: StragglerSpec = Field(default_factory=StragglerSpec)
    anomalies: AnomalySpec = Field(default_factory=AnomalySpec)

    @model_validator(mode="after")
    def _heartbeats_outlast_inprocess_restarts(self) -> ResiliencySpec:
        # ft_launcher hears no heartbeat while ranks restart in-process; a shorter timeout would kill them.
        if self.inprocess.enabled and self.heartbeat_timeout_s <= self.inprocess.soft_timeout_s:
            raise ValueError(
                "resiliency.heartbeat_timeout_s must be greater than resiliency.inprocess.soft_timeout_s: "
                "ft_launcher would restart ranks in the middle of an in-process restart"
            )
        return self


def check_slowdown(kind: str, fraction: float | None, duration_steps: int | None) -> None:
    """A slowdown needs its fraction and duration; no other kind takes them."""
    if kind == "slowdown":
        if fraction is None:
            raise ValueError("a slowdown needs fraction: 0 < fraction <= 10 (0.5 makes each step 50 % longer)")
        if duration_steps is None:
            raise ValueError("a slowdown needs duration_steps: how many steps it lasts (at least 1)")
    elif fraction is not None or duration_steps is not None:
        raise ValueError(f"fraction and duration_steps are for kind slowdown only, not {kind}")


# A slowdown's bounds: the fraction of its step time the rank sleeps each step, and for how many steps.
SlowdownFraction = Annotated[float, Field(gt=0, le=10, strict=True)]
SlowdownSteps = Annotated[int, JsonInt(ge=1, le=10**9)]


class FaultSpec(StrictModel):
    """A deterministic fault: `kind` at `rank` when the trainer reaches `at_step` (once per job). A slowdown makes
    the rank sleep `fraction` of its step time in each of `duration_steps` steps from there."""

    kind: Literal["exception", "crash", "hang", "slowdown"]
    rank: int = Field(ge=0, le=1_000_000)
    at_step: int = Field(ge=0, le=10**12)
    fraction: SlowdownFraction | None = None
    duration_steps: SlowdownSteps | None = None

    @model_validator(mode="after")
    def _slowdown(self) -> FaultSpec:
        check_slowdown(self.kind, self.fraction, self.duration_steps)
        return self


class JobSpec(StrictModel):
    name: DnsLabel
    backend: Literal["local", "kubernetes"] = "local"
    image: str | None = Field(default=None, min_length=1, max_length=512)
    namespace: DnsLabel = "default"
    command: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(min_length=1, max_length=256)
    nodes: int = Field(default=1, ge=1, le=4096)
    procs_per_node: int = Field(default=1, ge=1, le=64)
    resources: Resources = Field(default_factory=Resources)
    env: dict[EnvName, Annotated[str, StringConstraints(max_length=8192)]] = Field(
        default_factory=dict, max_length=256, json_schema_extra=keys_match_pattern
    )
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    resiliency: ResiliencySpec = Field(default_factory=ResiliencySpec)
    progress: ProgressSpec = Field(default_factory=ProgressSpec)
    faults: list[FaultSpec] = Field(default_factory=list, max_length=100)
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    secret_env: dict[EnvName, SecretKeyRef] = Field(
        default_factory=dict,
        max_length=64,
        json_schema_extra=keys_match_pattern,
        description="Variables whose values come from Kubernetes Secrets, by reference (kubernetes).",
    )
    queue: QueueName | None = Field(
        default=None, description="A Kueue LocalQueue in the job's namespace: the job waits there until admitted."
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, json_schema_extra=keys_match_pattern
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def report_interval_s(self) -> float:
        """How often each node's agent reports (the spec's, else the default for the job's size)."""
        return self.progress.report_interval_s or default_report_interval(self.nodes)

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.backend == "kubernetes" and not self.image:
            raise ValueError("image is required when backend is kubernetes")
        if self.backend == "local" and self.nodes > MAX_LOCAL_NODES:
            raise ValueError(f"nodes must be at most {MAX_LOCAL_NODES} for the local backend (every node runs here)")
        floor = TIMEOUT_INTERVALS * self.report_interval_s
        for name in ("heartbeat_timeout_s", "initial_heartbeat_timeout_s"):
            if getattr(self.resiliency, name) < floor:
                raise ValueError(
                    f"resiliency.{name} must be at least {floor:g} s: {TIMEOUT_INTERVALS} node report intervals "
                    f"of {self.report_interval_s:g} s (set progress.report_interval_s lower, or the timeout higher)"
                )
        for name in [*self.env, *self.secret_env]:
            where = "env" if name in self.env else "secret_env"
            if name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{where}.{name}: variables starting with {RESERVED_ENV_PREFIX} are set by ftplane")
            if name in self.env and name in self.secret_env:
                raise ValueError(f"secret_env.{name}: also in env; give each variable once")
        if self.backend != "kubernetes" and (only := kubernetes_only_fields(self)):
            raise ValueError(
                f"{', '.join(only)}: only the kubernetes backend can honour this (backend is {self.backend})"
            )
        stragglers = self.resiliency.stragglers
        if stragglers.window_s < floor:
            raise ValueError(
                f"resiliency.stragglers.window_s must be at least {floor:g} s: {TIMEOUT_INTERVALS} node report "
                f"intervals of {self.report_interval_s:g} s (each rank is judged on several reports)"
            )
        if stragglers.action == "exclude" and not self.resiliency.exclude_failed_nodes:
            raise ValueError(
                "resiliency.stragglers.action exclude needs resiliency.exclude_failed_nodes: true (a restart on the "
                "same node would not help)"
            )
        if self.nodes + self.resiliency.spare_nodes > 4096:
            raise ValueError("nodes + resiliency.spare_nodes must be at most 4096")
        for i, fault in enumerate(self.faults):
            if fault.rank >= self.world_size:
                raise ValueError(f"faults[{i}].rank {fault.rank} is outside the job's {self.world_size} ranks")
        if self.checkpoint.engine != "none" and not self.checkpoint.dir and self.backend == "kubernetes":
            raise ValueError("checkpoint.dir is required for checkpoints on kubernetes (shared storage)")
        return self
