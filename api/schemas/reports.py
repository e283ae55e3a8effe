"""The node agent's batched report (`POST /v1/jobs/{id}/reports`): one per node per interval.

It carries the node's liveness (the agent, its launcher, each local rank's process, GPU health),
the ranks' newest heartbeats and the events queued since the last report. Its reply carries the
faults for this node: those the agent carries out itself, and those it forwards to a rank.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from api.schemas.events import (
    MAX_EVENTS_PER_BATCH,
    MAX_HEARTBEATS_PER_BATCH,
    AttemptNumber,
    EventIn,
    FaultDirective,
    HeartbeatIn,
    Rank,
)
from api.schemas.scalars import JsonInt
from ftplane import contract

MAX_RANKS_PER_NODE = contract.MAX_RANKS_PER_NODE
MAX_GPUS_PER_NODE = contract.MAX_GPUS_PER_NODE

Pid = Annotated[int, JsonInt(ge=0, le=2**31)]
ExitCode = Annotated[int, JsonInt(ge=-255, le=255)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LauncherStatus(Strict):
    pid: Pid | None = None
    alive: StrictBool = True
    exit_code: ExitCode | None = None


class RankProcessStatus(Strict):
    rank: Rank
    local_rank: Annotated[int, JsonInt(ge=0, le=MAX_RANKS_PER_NODE)] | None = None
    pid: Pid | None = None
    alive: StrictBool
    exit_code: ExitCode | None = None
    signal: str | None = Field(default=None, max_length=32)


class GpuStatus(Strict):
    index: Annotated[int, JsonInt(ge=0, le=MAX_GPUS_PER_NODE)]
    xid_errors: list[Annotated[int, JsonInt(ge=0, le=2**31)]] = Field(default_factory=list, max_length=256)
    ecc_uncorrected: Annotated[int, JsonInt(ge=0, le=2**62)] = 0
    throttled: list[str] = Field(default_factory=list, max_length=16)


class NodeStatus(Strict):
    pid: Pid | None = Field(default=None, description="The agent's own process.")
    launcher: LauncherStatus | None = None
    ranks: list[RankProcessStatus] = Field(default_factory=list, max_length=MAX_RANKS_PER_NODE)
    progress: Literal["sdk", "log", "none"] = Field(
        default="none",
        description="How this node's ranks report progress: through the SDK, from a log pattern, or not at all "
        "(then hang detection for the job is node-level only).",
    )
    interval_s: float | None = Field(default=None, gt=0, le=3600, strict=True)
    healthy: StrictBool = True
    unhealthy_reason: str | None = Field(default=None, max_length=2000)
    gpus: list[GpuStatus] = Field(default_factory=list, max_length=MAX_GPUS_PER_NODE)


class NodeReport(Strict):
    attempt: AttemptNumber
    node: str = Field(min_length=1, max_length=contract.MAX_NODE_NAME)
    agent: NodeStatus = Field(default_factory=NodeStatus)
    heartbeats: list[HeartbeatIn] = Field(default_factory=list, max_length=MAX_HEARTBEATS_PER_BATCH)
    events: list[EventIn] = Field(default_factory=list, max_length=MAX_EVENTS_PER_BATCH)


class NodeDirective(FaultDirective):
    delivery: Literal["agent", "trainer"] = Field(
        description="agent: the node's agent carries it out; trainer: the agent hands it to the rank."
    )


class ReportResult(BaseModel):
    stored: int = Field(description="Events newly stored by this report.")
    duplicates: int = Field(description="Events already stored under the same key (a resend).")
    accepted: int = Field(description="Heartbeats accepted.")
    faults: list[NodeDirective] = Field(default_factory=list)


class NodeOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    node: str
    attempt: int
    last_seen: datetime
    launcher_alive: StrictBool
    progress: str
    healthy: bool
    unhealthy_reason: str | None
    ranks: list[dict[str, object]]
    gpus: list[dict[str, object]]
    stale: bool = False
