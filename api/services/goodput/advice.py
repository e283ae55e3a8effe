"""Checkpoint-interval advice from a job's goodput figures.

Advice (Young/Daly, first order)
    C = median blocking_s of the saves; M = wall / failures, once MIN_FAILURES are seen;
    R = (fault_detection + restart) / failures. tau* = sqrt(2CM) training seconds between saves
    (tau*/step_time steps). For an interval tau the lost fraction is C/tau + tau/(2M) + R/M, plus the
    share of wall time stragglers cost so far (S/wall: no interval changes it, but the predicted ETTR
    is then one the job can reach), and the predicted ETTR is 1 minus that. The job's current interval
    is the one its reported checkpoints show (the median step gap between them, whatever the spec's
    engine: a framework or the job's own code may save), else spec.checkpoint.interval_steps, times
    step_time.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from api.schemas.goodput import Advice, IntervalPrediction

MIN_FAILURES = 2


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def advise(
    blocking: Sequence[float],
    *,
    wall: float,
    failures: int,
    recovery_s: float,
    step_time: float | None,
    interval_steps: int | None,
    straggler_s: float = 0.0,
    interval_measured: bool = False,
) -> Advice:
    c = statistics.median(blocking) if blocking else None
    m = wall / failures if failures >= MIN_FAILURES and wall > 0 else None
    r = recovery_s / failures if failures else None
    notes = []
    if c is None:
        notes.append("no checkpoint saved yet: C unknown")
    if m is None:
        notes.append(f"not enough failures yet ({failures} seen, {MIN_FAILURES} needed to estimate M)")
    if step_time is None:
        notes.append("step time unknown (no progress measured yet)")

    def predict(tau: float) -> IntervalPrediction:
        steps = tau / step_time if step_time else None
        if c is None or m is None or r is None or tau <= 0:
            return IntervalPrediction(
                interval_s=round(tau, 3), interval_steps=_round(steps, 1), lost_fraction=None, predicted_ettr=None
            )
        lost = {"checkpoint": c / tau, "recompute": tau / (2 * m), "restart": r / m}
        if straggler_s > 0 and wall > 0:
            lost["straggler"] = straggler_s / wall  # as measured: no interval changes it
        return IntervalPrediction(
            interval_s=round(tau, 3),
            interval_steps=_round(steps, 1),
            lost_fraction={k: round(v, 6) for k, v in lost.items()},
            predicted_ettr=round(max(0.0, 1.0 - sum(lost.values())), 6),
        )

    optimal = None
    if c is not None and m is not None:
        tau = math.sqrt(2 * c * m)
        if step_time:
            tau = max(tau, step_time)  # no interval shorter than one step
        optimal = predict(tau) if tau > 0 else None
        if c == 0:
            notes.append("saves do not block training (C = 0): any interval costs nothing to checkpoint")
    current = None
    if interval_steps is None:
        notes.append(
            "no checkpoint interval: fewer than two checkpoints reported, and checkpointing is off in the spec"
        )
    elif step_time:
        current = predict(interval_steps * step_time)
    if not notes:
        notes.append("first-order Young/Daly: valid while the interval is much shorter than M")
    return Advice(
        checkpoint_blocking_s=_round(c, 6),
        checkpoints=len(blocking),
        failures=failures,
        min_failures=MIN_FAILURES,
        mtbf_s=_round(m),
        restart_cost_s=_round(r),
        step_time_s=_round(step_time, 6),
        straggler_s=round(straggler_s, 3),
        optimal=optimal,
        current=current,
        current_from="reported checkpoints" if interval_measured else ("spec" if interval_steps else None),
        note="; ".join(notes),
    )
