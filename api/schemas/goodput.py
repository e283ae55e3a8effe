"""Shapes of `GET /v1/jobs/{id}/goodput`: where a job's wall time went, and checkpoint-interval advice.

The accounting itself (which interval belongs to which bucket) is defined in `api/services/goodput/`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

LOST_BUCKETS = (
    "initialization",
    "queued",
    "checkpoint_stall",
    "fault_detection",
    "restart",
    "recompute",
    "straggler",
    "shutdown",
)


class Breakdown(BaseModel):
    """One stretch of wall time, partitioned exactly: productive_s + sum(lost_s.values()) == wall_s."""

    wall_s: float = Field(description="Seconds from the stretch's start to its end (now, for a job still running).")
    productive_s: float = Field(description="Seconds spent training steps not trained before (no stalls, no redo).")
    lost_s: dict[str, float] = Field(
        description="Seconds lost, by cause: " + ", ".join(LOST_BUCKETS) + " (every key always present)."
    )
    ettr: float | None = Field(description="Effective training time ratio: productive_s / wall_s (null if wall is 0).")


class AttemptGoodput(Breakdown):
    attempt: int
    start: datetime = Field(description="Launch of attempt 0, or the job_restart that created this attempt.")
    end: datetime = Field(description="The next attempt's job_restart, the job's end, or now.")
    failures: int = Field(description="Failures whose detection or onset fell in this attempt.")


class IntervalPrediction(BaseModel):
    """What the first-order model predicts for one checkpoint interval."""

    interval_s: float = Field(description="Training seconds between checkpoints.")
    interval_steps: float | None = Field(description="The same in steps (null when the step time is unknown).")
    lost_fraction: dict[str, float] | None = Field(
        description="checkpoint = C/tau, recompute = tau/(2M), restart = R/M, and straggler = the share of wall "
        "time stragglers cost so far, where they cost any (null without enough failures)."
    )
    predicted_ettr: float | None = Field(description="1 - the sum of lost_fraction, at least 0.")


class Advice(BaseModel):
    """The Young/Daly checkpoint interval from the job's own measurements."""

    checkpoint_blocking_s: float | None = Field(description="C: median blocking_s of the job's checkpoint saves.")
    checkpoints: int = Field(description="checkpoint_saved events C is measured from.")
    failures: int
    min_failures: int = Field(description="Failures needed before M is estimated.")
    mtbf_s: float | None = Field(description="M: wall_s / failures (null until min_failures are seen).")
    restart_cost_s: float | None = Field(description="R: (fault_detection + restart) seconds per failure.")
    step_time_s: float | None = Field(description="Measured seconds per training step.")
    straggler_s: float = Field(default=0.0, description="Seconds stragglers cost (the straggler bucket).")
    optimal: IntervalPrediction | None = Field(description="tau = sqrt(2CM) and what it predicts.")
    current: IntervalPrediction | None = Field(
        description="The job's current interval, predicted: the one its reported checkpoints show (the median step "
        "gap between them), else spec.checkpoint.interval_steps."
    )
    current_from: Literal["reported checkpoints", "spec"] | None = Field(
        default=None, description="Where the current interval comes from."
    )
    note: str = Field(description="What is missing for advice, or how to read it.")


class RollingGoodput(BaseModel):
    """The ETTR of the last `window_s` of the job's wall time (to now, or to its end)."""

    window_s: float
    wall_s: float = Field(description="The part of the window inside the job's wall time.")
    productive_s: float
    ettr: float | None


class RunStart(BaseModel):
    """Where one run (one start of the training loop) began, and what says so: goodput's start of productive time."""

    attempt: int
    restart_count: int = Field(description="ft_launcher's in-job restarts before this run.")
    iteration: int = Field(description="NVRx's in-process restart iteration.")
    start: datetime = Field(description="When the run's productive time starts.")
    start_step: int | None = Field(description="The step it resumed from (null: nobody said; recompute unknown).")
    basis: Literal["sdk", "progress", "processes"] = Field(
        description="sdk: the ranks' SDK said the loop started; progress: the node agent read the run's start or "
        "first step in the ranks' output (zero-code progress); processes: the ranks' processes were up (zero-code "
        "without progress: start-up counts as productive, recompute cannot be told)."
    )


class GoodputOut(Breakdown):
    """The job's total (the top-level fields), each attempt, and the advice."""

    job_id: str
    status: str
    finished: bool = Field(description="False while the job runs: wall time then ends now.")
    start: datetime | None = Field(description="Launch of attempt 0 (null before the job is launched).")
    end: datetime | None = Field(description="The job's end event, or now for a job still running.")
    failures: int = Field(description="Failures: training (or start-up) stretches ended by a detected fault.")
    step_time_s: float | None = Field(description="Measured seconds per step (stalls excluded), over all runs.")
    recomputed_steps: int | None = Field(
        description="Steps trained again after resuming from an older checkpoint; null when a run resumed from a step "
        "nobody reported (a zero-code job without progress): ftplane cannot tell, and counts none as recompute."
    )
    runs: list[RunStart] = Field(default_factory=list, description="Each run's start, and what says where it began.")
    attempts: list[AttemptGoodput]
    rolling: list[RollingGoodput] = Field(
        default_factory=list, description="ETTR over the last 5, 15 and 60 minutes of wall time."
    )
    launcher_phases: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Where the launcher timed them (NVRx 0.5+): seconds of the initialization and restart buckets "
        "spent terminating the worker group, in the rendezvous (its node health check included, and also given "
        "apart as health_check) and starting the workers; summed over cycles, the slowest node's time of each. "
        "The rest of each bucket is what the launcher does not time. Empty with NVRx 0.4.1.",
    )
    advice: Advice
