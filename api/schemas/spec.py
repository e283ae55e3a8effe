"""The job spec: the body of `POST /v1/jobs` and the YAML users write.

Unknown keys are refused everywhere (extra="forbid") so a typo is an error
naming the key, never a silently ignored setting.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"

DnsLabel = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL)]
LabelKey = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=LABEL_KEY)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]
EnvName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=ENV_NAME)]
Quantity = Annotated[str, StringConstraints(max_length=32, pattern=QUANTITY)]


def keys_match_pattern(schema: dict[str, Any]) -> None:
    """Document a dict whose keys have a pattern as validated: every key must match it.

    pydantic writes the key pattern as `patternProperties`, which in JSON Schema lets keys that
    do not match through with any value; `propertyNames` says what the API actually accepts.
    """
    if len(schema.get("patternProperties", {})) != 1:
        return
    ((pattern, value),) = schema.pop("patternProperties").items()
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}
    schema["additionalProperties"] = value


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
        "(pods unschedulable, image not pulled); it counts as a failure of the attempt. None: wait forever.",
    )

    @model_validator(mode="after")
    def _heartbeats_outlast_inprocess_restarts(self) -> ResiliencySpec:
        # ft_launcher hears no heartbeat while ranks restart in-process; a shorter timeout would kill them.
        if self.inprocess.enabled and self.heartbeat_timeout_s <= self.inprocess.soft_timeout_s:
            raise ValueError(
                "resiliency.heartbeat_timeout_s must be greater than resiliency.inprocess.soft_timeout_s: "
                "ft_launcher would restart ranks in the middle of an in-process restart"
            )
        return self


class FaultSpec(StrictModel):
    """A deterministic fault: `kind` at `rank` when the trainer reaches `at_step` (once per job)."""

    kind: Literal["exception", "crash", "hang"]
    rank: int = Field(ge=0, le=1_000_000)
    at_step: int = Field(ge=0, le=10**12)


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
    faults: list[FaultSpec] = Field(default_factory=list, max_length=100)
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, json_schema_extra=keys_match_pattern
    )

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        if self.backend == "kubernetes" and not self.image:
            raise ValueError("image is required when backend is kubernetes")
        if self.backend == "local" and self.nodes != 1:
            raise ValueError("nodes must be 1 for the local backend (it runs on one machine)")
        for name in self.env:
            if name.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"env.{name}: variables starting with {RESERVED_ENV_PREFIX} are set by ftplane")
        for i, fault in enumerate(self.faults):
            if fault.rank >= self.world_size:
                raise ValueError(f"faults[{i}].rank {fault.rank} is outside the job's {self.world_size} ranks")
        if self.checkpoint.engine != "none" and not self.checkpoint.dir and self.backend == "kubernetes":
            raise ValueError("checkpoint.dir is required for checkpoints on kubernetes (shared storage)")
        return self
