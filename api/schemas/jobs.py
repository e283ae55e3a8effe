"""Shapes of the jobs API."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator
from pydantic.config import JsonDict

from api.schemas.events import EventOut
from api.schemas.scalars import JsonInt
from api.schemas.spec import SlowdownFraction, SlowdownSteps, check_slowdown


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    number: int
    status: str
    cause: str | None
    in_job_restarts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    name: str
    project: str
    backend: str
    status: str
    status_reason: str | None
    attempt: int
    job_restarts: int
    labels: dict[str, str]
    excluded_nodes: list[str]
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    spec: dict[str, Any]


class JobCreated(JobOut):
    token: str = Field(description="The job-scoped trainer token. Shown once; store it now.")


class JobProgress(BaseModel):
    hang_detection: Literal["rank", "node"] = Field(
        description="rank: each rank's progress is reported (SDK or log pattern), so a silent rank is a hang; "
        "node: the ranks report nothing, so hangs are detected at the node level only (a silent node agent)."
    )
    step: int | None = Field(description="The highest step any rank of the current attempt reported.")
    total_steps: int | None = Field(description="The steps the job will run, when its ranks say.")
    fraction: float | None = Field(description="step / total_steps.")
    step_time_s: float | None = Field(description="Median seconds per step over the ranks.")
    eta_s: float | None = Field(description="Seconds to the last step at that pace (while the job runs).")


class JobDetail(JobOut):
    attempts: list[AttemptOut]
    recent_events: list[EventOut]
    progress: JobProgress | None = None


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None


# When a fault fires, as the schema states it: exactly one of `at_step` (a step number) or `now: true`;
# a node_loss only now; a slowdown with its fraction and duration, no other kind with them. The validator
# below enforces the same rules, with messages that say what to send.
_WHEN: JsonDict = {
    "oneOf": [
        {
            "title": "at a step",
            "required": ["at_step"],
            "properties": {
                "kind": {"enum": ["exception", "crash", "hang", "slowdown"]},
                "at_step": {"type": "integer"},
                "now": {"const": False},
            },
        },
        {
            "title": "now",
            "required": ["now"],
            "properties": {"now": {"const": True}, "at_step": {"type": "null"}},
        },
    ],
    # What goes with the kind: a slowdown's fraction and duration, for a slowdown only.
    "anyOf": [
        {
            "title": "a slowdown",
            "required": ["fraction", "duration_steps"],
            "properties": {
                "kind": {"const": "slowdown"},
                "fraction": {"type": "number"},
                "duration_steps": {"type": "integer"},
            },
        },
        {
            "title": "any other kind",
            "properties": {
                "kind": {"enum": ["exception", "crash", "hang", "node_loss"]},
                "fraction": {"type": "null"},
                "duration_steps": {"type": "null"},
            },
        },
    ],
}


class FaultIn(BaseModel):
    """A fault to inject into a running job: at `at_step`, or now (`now: true`); never both. A node_loss is
    injected now only. A slowdown makes the rank sleep `fraction` of its step time in each of `duration_steps`
    steps (the rank's own code does it, from the step given or the next one)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_WHEN)

    kind: Literal["exception", "crash", "hang", "node_loss", "slowdown"]
    rank: Annotated[int, JsonInt(ge=0, le=1_000_000)]
    at_step: Annotated[int, JsonInt(ge=0, le=10**12)] | None = None
    now: StrictBool = False
    fraction: SlowdownFraction | None = Field(
        default=None, description="slowdown only: 0 < fraction <= 10 of the rank's step time slept each step."
    )
    duration_steps: SlowdownSteps | None = Field(default=None, description="slowdown only: how many steps (>= 1).")

    @model_validator(mode="after")
    def _when(self) -> FaultIn:
        if (self.at_step is None) == (not self.now):
            raise ValueError("give exactly one of at_step or now: true")
        if self.kind == "node_loss" and not self.now:
            raise ValueError("node_loss can only be injected now")
        check_slowdown(self.kind, self.fraction, self.duration_steps)
        return self


class FaultOut(BaseModel):
    id: str
    job_id: str
    attempt: int
    kind: str
    rank: int
    at_step: int | None
    fraction: float | None = None
    duration_steps: int | None = None
    delivery: Literal["agent", "trainer"] = Field(
        description="agent: the node agent of the rank's node carries it out (a signal, the node's loss); "
        "trainer: the rank's own code injects it (through the SDK)."
    )
