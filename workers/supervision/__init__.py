"""Supervision: a set of duties, one module each, each with a `run_once(session)` over a batch of jobs.

`DUTIES` below is their one list: each becomes a Celery task and a beat entry at its period, the
supervision period or, for the fleet's ledgers, the fleet's (workers/tasks/duties.py,
workers/celery_app.py), so a slow backend holds up only the duty, and within reconcile only the job,
that waits on it.

Every decision goes through `api.services.lifecycle`; a duty only reads, asks, and carries out. A duty
whose failure restarts a job does so through `lifecycle.attempt_failed`, which hands the new attempt's
launch to the submit task once the restart is committed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from api.core.config import Settings
from workers.supervision import (
    cancel_jobs,
    detect_restart_anomalies,
    detect_silent_ranks,
    detect_stragglers,
    evaluate_objectives,
    judge_nodes,
    launch_attempts,
    reconcile_attempts,
    release_finished_jobs,
    summarize_goodput,
    time_out_pending,
)


@dataclass(frozen=True)
class Duty:
    """One supervision duty: its name, the pass it makes over its jobs (how many it acted on), what it does."""

    name: str
    run_once: Callable[[Session], int]
    does: str
    # supervision: every FTPLANE_SUPERVISE_INTERVAL_S (it follows jobs); fleet: every FTPLANE_FLEET_INTERVAL_S
    cadence: Literal["supervision", "fleet"] = "supervision"

    def period_s(self, settings: Settings) -> float:
        """Seconds between its passes (its beat entry's schedule)."""
        return settings.fleet_interval_s if self.cadence == "fleet" else settings.supervise_interval_s

    @property
    def task(self) -> str:
        """Its Celery task's name (what beat sends)."""
        return f"ftplane.{self.name}"

    @property
    def beat_entry(self) -> str:
        return self.name.replace("_", "-")

    @property
    def title(self) -> str:
        return self.name.replace("_", " ")


DUTIES: tuple[Duty, ...] = (
    Duty(
        "launch_attempts",
        launch_attempts.run_once,
        "launch the current attempt of new and restarted jobs (tearing the one it replaces down first)",
    ),
    Duty(
        "reconcile_attempts",
        reconcile_attempts.run_once,
        "read each launched attempt's status from its backend, record what the backend saw, and end the "
        "attempt when it is over",
    ),
    Duty(
        "detect_silent_ranks",
        detect_silent_ranks.run_once,
        "hang_detected for ranks past their heartbeat timeout (database only)",
    ),
    Duty(
        "detect_stragglers",
        detect_stragglers.run_once,
        "straggler_detected / straggler_cleared once per episode, and the exclude action (database only)",
    ),
    Duty(
        "detect_restart_anomalies",
        detect_restart_anomalies.run_once,
        "restart storms, stalled progress, stuck recoveries (database only)",
    ),
    Duty(
        "time_out_pending_attempts",
        time_out_pending.run_once,
        "give up on attempts that never started running within the spec's timeout",
    ),
    Duty("cancel_jobs", cancel_jobs.run_once, "tear down jobs whose cancellation was asked for"),
    Duty(
        "judge_nodes",
        judge_nodes.run_once,
        "the fleet's node ledger: nodes, runs and faults from the new events; node states by the reputation rule "
        "(database only)",
        cadence="fleet",
    ),
    Duty(
        "release_finished_jobs",
        release_finished_jobs.run_once,
        "free what an ended job leaves behind (processes, pods, Secrets, tokens)",
    ),
    Duty(
        "summarize_goodput",
        summarize_goodput.run_once,
        "recompute the fleet summary of jobs with new events, never summarized, or running (database only)",
        cadence="fleet",
    ),
    Duty(
        "evaluate_objectives",
        evaluate_objectives.run_once,
        "evaluate ETTR objectives; one objective_breached webhook per breach (database only)",
        cadence="fleet",
    ),
)
