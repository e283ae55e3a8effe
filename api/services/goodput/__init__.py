"""Goodput: where a job's wall time went, computed from its events alone.

Modules: records (reading the events), windows (runs and failures), accounting (the buckets), attempts
(the split per attempt), advice (the checkpoint interval). The rules they implement:

Wall time
    From the launch of attempt 0 (its `submitted` event; the earliest event if there is none) to the
    job's end event (`succeeded`, `failed` or `cancelled`), or to now while the job runs. Time queued
    before the launch is not the job's. Event times outside that span are clamped into it.

Runs
    A run is one start of the training loop: the `running` events of one (attempt, restart_count,
    iteration). Where a run's productive time starts, best first (the run's `basis`, listed in `runs`):
      * sdk: every rank's SDK says `running` when its loop starts or resumes, at its step; the run starts
        when the last of its ranks reported (the loop's first collective waits for all of them);
      * progress: the node agent read the run's start in the ranks' output (a preset's resume line, or
        the first step read: details.basis "progress"), with the step it resumed from where the output
        says it, else none;
      * processes: the node agent saw the run's rank processes up (details.basis "processes", no step):
        a zero-code job without progress, whose start-up then counts as productive.
    A run's window lasts until the next run starts, or until the end of wall time. (The job's status
    follows the ranks' liveness, not this: the agent's first `running` of a run moves it to RUNNING.)

Failures
    Inside a window (and before the first run: the start-up window) the first sign of trouble ends
    training. Signals, by what they tell:
      * onset only: `fault_injected`;
      * onset and detection: `rank_failed` sent by a rank, `node_failed`, `preempted`;
      * detection, with the onset at the rank's last heartbeat (`ts - details.silent_s`; at the
        detection without it): `hang_detected`, `heartbeat_lost`; a silence that began before the
        window's run started is about an earlier run and is skipped;
      * detection: `inprocess_restart`, `injob_restart`, `job_restart` — skipped when they end an
        earlier run (by restart_count, iteration, from_attempt), e.g. a restart recorded late.
    `rank_failed` observed by the launcher (details.source == "launcher") is no time signal: the
    supervisor records it in the same pass as the restart it causes, and its time may trail the
    next run's start. Its step still counts as progress evidence (below).
    onset = the earliest signal, where the silences (with silent_s) of a window count as one: the
    earliest of those at the highest step any of them shows. A rank waiting in a collective on a
    silent one goes silent too, so every rank's silence is recorded, and the highest step is where the
    job stopped; a rank last heard at a lower step was last heard before that, not silent since (the
    131,072-rank scale story's silent node: its agent's last report 29 s before the node stopped, 34
    steps behind the other ranks, at a 30 s report interval).
    detection = the earliest detection signal at or after the onset.
    A window with a signal is one failure.

Buckets (they partition wall time exactly; every second is in exactly one)
    initialization    start-up window up to the first run (or to the onset of a start-up failure)
    fault_detection   onset → detection (to the window's end while undetected)
    restart           detection → the next run's start (to the end when training never resumed):
                      teardown, relaunch, process start, rendezvous, checkpoint load; a job-level
                      restart's new attempt is in here until its first run
    checkpoint_stall  inside a run's training time: each save's blocking part, placed at
                      [ts - total_s, ts - total_s + blocking_s) of its `checkpoint_saved`
    recompute         inside a run's training time (stalls excluded): its first
                      (H - start_step) x step_time seconds, where H is the highest step the events
                      show reached before the run started (fault/failure/hang steps, failed_step
                      of restarts, checkpoint steps; for a zero-code job the agent's, from the
                      ranks' output): steps redone after resuming from an older checkpoint. A run
                      after the first whose start step nobody said: none counted, and
                      `recomputed_steps` is null (ftplane cannot tell)
    queued            carved out of initialization and restart: an attempt waiting in a queue (Kueue), from
                      its `queued` event (details.queue_state "waiting") to its admission (a `queued` event
                      with queue_state "admitted"), else to the next run's start, job restart or the job's
                      end; nothing of the job runs meanwhile, and it is the queue's time, not a fault's
                      (the advice's restart cost leaves it out)
    shutdown          a succeeded job's tail: from the end of its last run's final checkpoint
                      blocking, and of the steps after it (to the `succeeded` event's final_step,
                      the highest its ranks reported, at the measured step time), to `succeeded`;
                      without a checkpoint in the last run, from its start and the steps from its
                      start step to final_step; where those steps are not known, the tail stays
                      productive
    productive        the rest of every run's training time
    Training time of a run = its start → its onset (or the window's end). ETTR = productive / wall.

Per attempt
    Attempt a > 0 starts at the `job_restart` that created it (else at its earliest event); attempt 0
    at the wall start. The intervals above are split at those boundaries, so the attempts' buckets sum
    to the total's.

Step time
    Seconds per step, stalls excluded, from each run's progress points: (run start, start_step),
    (save start, checkpoint step), (onset, step of the fault or silence; a launcher-observed failure
    at its details.step_at, when the agent read its last step: that one counts to the run's window end,
    past its failure's onset, since the rank trained until then). Over all runs with a start step: the
    sum of each run's time to its furthest point over the sum of its steps.

Launcher phases (inside initialization and restart, where NVRx 0.5+ times its cycles): launcher_phases.py.

Advice: advice.py.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.schemas.events import utcnow
from api.schemas.goodput import GoodputOut
from api.services import lifecycle
from api.services.goodput.accounting import account
from api.services.goodput.advice import MIN_FAILURES, advise
from api.services.goodput.records import Record, load_records

__all__ = ["MIN_FAILURES", "Record", "account", "advise", "empty", "job_goodput", "load_records"]


def job_goodput(session: Session, job: Job, *, now: datetime | None = None) -> GoodputOut | None:
    """The goodput of `job`, or None before it was launched (no events yet)."""
    records = load_records(session, job.id)
    if not records:
        return None
    spec = lifecycle.spec_of(job)
    interval = spec.checkpoint.interval_steps if spec.checkpoint.engine != "none" else None
    return account(records, now=now or utcnow(), job_id=job.id, status=job.status, interval_steps=interval)


def empty(job: Job) -> GoodputOut:
    """A job without events (not launched yet): no wall time."""
    return account([], now=utcnow(), job_id=job.id, status=job.status)
