"""Goodput as the dashboard draws it: ETTR, the bar of where the wall time went, the advice in words."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from api.database.tables import Job
from api.schemas.goodput import Advice, GoodputOut, IntervalPrediction
from api.services import goodput


@dataclass(frozen=True)
class GoodputView:
    ettr: float | None
    wall_s: float | None
    productive_s: float | None
    lost: list[tuple[str, float]]
    advice: tuple[str, ...] = field(default=())  # lines of text: the checkpoint interval that fits the job
    rolling: tuple[tuple[str, float | None], ...] = field(default=())  # ("5 min", ETTR) over the last minutes
    launcher: tuple[str, ...] = field(default=())  # lines of text: the launcher's timing of start and restarts
    runs: str = ""  # what says where the runs' productive time starts, and whether recompute can be told

    @classmethod
    def of(cls, out: GoodputOut) -> GoodputView:
        """Each bucket that lost time, labelled in words (`checkpoint_stall` -> `checkpoint stall`)."""
        lost = [(name.replace("_", " "), seconds) for name, seconds in out.lost_s.items() if seconds > 0]
        return cls(
            ettr=out.ettr,
            wall_s=out.wall_s,
            productive_s=out.productive_s,
            lost=lost,
            advice=advice_lines(out.advice),
            rolling=tuple((f"{r.window_s / 60:g} min", r.ettr) for r in out.rolling),
            launcher=launcher_lines(out.launcher_phases),
            runs=runs_line(out),
        )

    def bar(self, width: float = 1000.0) -> list[tuple[str, float, float, float]]:
        """(label, seconds, x, w) segments: productive first, then each kind of lost time."""
        parts = ([("productive", self.productive_s)] if self.productive_s else []) + list(self.lost)
        total = self.wall_s or sum(s for _, s in parts) or 0.0
        out: list[tuple[str, float, float, float]] = []
        x = 0.0
        for label, seconds in parts:
            w = width * seconds / total if total > 0 else 0.0
            out.append((label, seconds, x, w))
            x += w
        return out


def goodput_of(session: Session, job: Job) -> GoodputView | None:
    """The job's goodput, or None before it was launched."""
    out = goodput.job_goodput(session, job)
    return GoodputView.of(out) if out is not None else None


BASIS_WORDS = {
    "sdk": "the ranks' SDK",
    "progress": "the ranks' output (zero-code progress)",
    "processes": "the ranks' processes being up (no progress: start-up counts as productive)",
}


def runs_line(out: GoodputOut) -> str:
    """`Productive time of 2 runs from: the ranks' SDK`, and that recompute cannot be told where it cannot."""
    if not out.runs:
        return ""
    bases = list(dict.fromkeys(BASIS_WORDS[r.basis] for r in out.runs))
    text = f"Productive time of {len(out.runs)} run{'s' if len(out.runs) > 1 else ''} from: {'; '.join(bases)}"
    if out.recomputed_steps is None:
        text += ". Steps redone after a restart: cannot tell (no run said where it resumed)"
    return text


def launcher_lines(phases: dict[str, dict[str, float]]) -> tuple[str, ...]:
    """`Restart, as the launcher timed it: termination 2.5 s · rendezvous 3.0 s · ...`, per bucket it timed."""
    return tuple(
        f"{bucket.capitalize()}, as the launcher timed it: "
        + " · ".join(f"{name.replace('_', ' ')} {seconds:.1f} s" for name, seconds in times.items())
        for bucket, times in phases.items()
    )


def _interval(prediction: IntervalPrediction) -> str:
    seconds, steps, ettr = prediction.interval_s, prediction.interval_steps, prediction.predicted_ettr
    text = f"{steps:.0f} steps ({seconds:.1f} s of training)" if steps is not None else f"{seconds:.1f} s of training"
    return text + (f": predicted ETTR {ettr * 100:.1f} %" if ettr is not None else "")


def advice_lines(advice: Advice) -> tuple[str, ...]:
    """The advice in words: the interval that fits the job's measured costs, and what the current one gives."""
    lines = []
    if advice.optimal is not None:
        costs = (("C", advice.checkpoint_blocking_s), ("M", advice.mtbf_s), ("R", advice.restart_cost_s))
        basis = ", ".join(f"{name} {value:.3g} s" for name, value in costs if value is not None)
        lines.append(f"Checkpoint every {_interval(advice.optimal)} (Young/Daly from {basis})")
    if advice.current is not None:
        lines.append(f"Now every {_interval(advice.current)}")
    if advice.note and advice.optimal is None:
        lines.append(f"Checkpoint interval advice: {advice.note}")
    if advice.straggler_s > 0:
        lines.append(
            f"Stragglers cost {advice.straggler_s:.1f} s: straggler_detected names their ranks and nodes; "
            "resiliency.stragglers.action: exclude restarts the job without them"
        )
    return tuple(lines)
