"""The job spec's recovery settings (`resiliency:`): the ladder's budgets and timeouts, in-process restart,
straggler detection and restart anomalies. Part of the job spec (api/schemas/spec.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from api.schemas.strict import StrictModel


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
    queued_timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=30 * 86400,
        description="With a `queue`: give up on a job whose attempt has waited this long in the queue without being "
        "admitted (it fails with scheduling_failed, no restart). None: wait for as long as the queue takes.",
    )
    stop_grace_s: int = Field(
        default=120,
        ge=5,
        le=3600,
        description="How long the ranks may take to stop once their pod is told to (an eviction, a drain, a "
        "cancel: SIGTERM, passed to the ranks), e.g. to save a checkpoint, before they are killed (kubernetes: "
        "the pods' terminationGracePeriodSeconds is this plus the node agent's own margin).",
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
