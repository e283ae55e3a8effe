"""The job spec: the body of `POST /v1/jobs` and the YAML users write.

Unknown keys are refused everywhere (extra="forbid") so a typo is an error
naming the key, never a silently ignored setting.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StringConstraints, field_validator, model_validator

from api.schemas.kubernetes_spec import (
    ZONE_LABEL,
    HugePageSize,
    LabelValue,
    QueueName,
    SchedulingSpec,
    SecretKeyRef,
    check_hugepages,
    keys_match_pattern,
    kubernetes_only_fields,
)
from api.schemas.resiliency import ResiliencySpec
from api.schemas.scalars import JsonInt
from api.schemas.strict import StrictModel

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"

DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=LABEL_KEY)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME)]
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=QUANTITY)]
# A job's id as another spec names it (ids are 32 hex digits; a path component either way, never "." or "..").
JobIdRef = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]


# Variables the backends set for the trainer; a spec may not override them.
RESERVED_ENV_PREFIX = "FTPLANE_"


class Resources(StrictModel):
    gpus_per_node: int = Field(default=0, ge=0, le=16)
    efa_per_node: int = Field(default=0, ge=0, le=64)
    cpu: Quantity | None = None
    memory: Quantity | None = None
    shm: Quantity | None = Field(default=None, description="Size of the /dev/shm memory volume (kubernetes).")
    ephemeral_storage: Quantity = Field(
        default="20Gi",
        description="The container's disk (its writable layer, its logs) each pod requests (kubernetes): the "
        "kubelet evicts, first, pods using more than they requested when a node runs short of disk.",
    )
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
    pvc: DnsLabel | None = Field(
        default=None,
        description="PersistentVolumeClaim holding the checkpoints (kubernetes): the claim's directory named for the "
        "job is mounted at dir, so each job sees and writes its own checkpoints only.",
    )
    resume_from: JobIdRef | None = Field(
        default=None,
        description="The id of an earlier job on the same checkpoint storage: this job starts from that job's newest "
        "complete checkpoint (read-only to it) until it has one of its own. Without it a job never sees another's.",
    )


MAX_LOG_PATTERN = 512
MAX_LOCAL_NODES = 8
# 131,072 GPUs at 8 a node: the largest training runs' size, which bench.scale measures the control plane at.
MAX_NODES = 16_384
# Node reports per second one job may send: past that many nodes, each node reports less often.
REPORTS_PER_JOB_S = 256
MAX_REPORT_INTERVAL_S = 30.0
# A heartbeat timeout must cover this many report intervals, so a late report or two is not a hang.
TIMEOUT_INTERVALS = 3


def default_report_interval(nodes: int) -> float:
    """1 s per node up to REPORTS_PER_JOB_S nodes; then longer, so the job stays within that many reports a second."""
    return min(MAX_REPORT_INTERVAL_S, max(1.0, nodes / REPORTS_PER_JOB_S))


ProgressPreset = Literal["lightning", "transformers", "torchtitan", "megatron"]  # = contract.PROGRESS_PRESETS


class ProgressSpec(StrictModel):
    """How ftplane learns each rank's progress when the training code does not use the SDK."""

    log_pattern: str | None = Field(
        default=None,
        max_length=MAX_LOG_PATTERN,
        description="A regular expression with a named group `step`, matched against each rank's output lines "
        r"(e.g. 'step (?P<step>\d+)'): each match is that rank's heartbeat at that step; an optional group "
        "`total` gives the run's steps (progress and ETA).",
    )
    preset: ProgressPreset | None = Field(
        default=None,
        description="Instead of a log_pattern: read what this framework prints by default (its step, total and the "
        "step a run resumed from; the node agent's trainer/agent/presets.py says what each reads and what it "
        "costs). lightning makes ftplane's Lightning entry point print the global step (ftplane installed where "
        "the ranks run); transformers sets TRANSFORMERS_VERBOSITY=info for the ranks unless env sets it.",
    )
    report_interval_s: float | None = Field(
        default=None,
        ge=0.1,
        le=MAX_REPORT_INTERVAL_S,
        description="How often each node's agent reports. Default: 1 s, longer past "
        f"{REPORTS_PER_JOB_S} nodes (the job then sends at most {REPORTS_PER_JOB_S} reports a second).",
    )

    @model_validator(mode="after")
    def _one_way(self) -> ProgressSpec:
        if self.log_pattern is not None and self.preset is not None:
            raise ValueError("give progress.log_pattern or progress.preset, not both")
        return self

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
    project: DnsLabel = Field(
        default="default", description="Who may see and act on the job: a project the caller is an operator of."
    )
    backend: Literal["local", "kubernetes"] = "local"
    image: str | None = Field(default=None, min_length=1, max_length=512)
    namespace: DnsLabel = "default"
    command: list[Annotated[str, StringConstraints(max_length=4096)]] = Field(min_length=1, max_length=256)
    working_dir: str | None = Field(
        default=None,
        max_length=1024,
        description="The directory the command runs in (an absolute path; relative paths of the command and of "
        "checkpoint.dir are relative to it). kubernetes: the container's workingDir (default: the image's). local: "
        "an existing directory on the control plane's host (the CLI makes a relative one absolute against the "
        "directory it runs in); default: a directory of the job's own under the data dir, kept across its restarts.",
    )
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
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
        description="Variables whose values come from Kubernetes Secrets, by reference; redacted from every line "
        "the ranks print. On the local backend `key` names a variable of the host's environment.",
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
        if self.working_dir is not None and not self.working_dir.startswith("/"):
            raise ValueError(
                f"working_dir must be an absolute path (got {self.working_dir!r}); `ftplane submit` makes a relative "
                "one absolute against the directory it runs in, for the local backend"
            )
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
        if self.nodes + self.resiliency.spare_nodes > MAX_NODES:
            raise ValueError(f"nodes + resiliency.spare_nodes must be at most {MAX_NODES}")
        for i, fault in enumerate(self.faults):
            if fault.rank >= self.world_size:
                raise ValueError(f"faults[{i}].rank {fault.rank} is outside the job's {self.world_size} ranks")
        if self.checkpoint.engine != "none" and not self.checkpoint.dir and self.backend == "kubernetes":
            raise ValueError("checkpoint.dir is required for checkpoints on kubernetes (shared storage)")
        if self.checkpoint.resume_from and (self.checkpoint.engine == "none" or not self.checkpoint.dir):
            raise ValueError("checkpoint.resume_from needs checkpoint.dir and an engine other than none")
        if self.backend == "kubernetes" and self.resources.efa_per_node and not self.scheduling.pinned_zone():
            raise ValueError(
                "scheduling.zone is required for a job that asks for EFA (resources.efa_per_node): EFA traffic does "
                f"not cross Availability Zones; give the zone (or node_selector.{ZONE_LABEL}, or one affinity value)"
            )
        if self.resiliency.queued_timeout_s is not None and not self.queue:
            raise ValueError("resiliency.queued_timeout_s needs queue: only a job in a Kueue queue waits in one")
        if self.checkpoint.resume_from and self.backend == "kubernetes" and not self.checkpoint.pvc:
            raise ValueError("checkpoint.resume_from needs checkpoint.pvc on kubernetes: the claim both jobs write to")
        return self
