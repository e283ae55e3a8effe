"""The goodput slot: the dashboard and `/metrics` show goodput once `api.services.goodput` exists.

Contract expected of that module: `job_goodput(session, job)` (or `for_job` / `compute`) returning
a mapping, dataclass or pydantic model with `ettr` (0..1), `wall_s`, `productive_s`, and the lost
time either as a mapping under `lost_s` / `lost` / `breakdown` (name -> seconds) or as other
`*_s` fields (`restart_s`, `checkpoint_s`, ...). Until it exists, both show an empty, labelled slot.
Optional: `advice`, a mapping with the checkpoint-interval advice (`optimal` / `current` predictions with
`interval_s`, `interval_steps`, `predicted_ettr`; `checkpoint_blocking_s`, `mtbf_s`, `restart_cost_s`; `note`),
shown as lines of text under the bar.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from api.database.tables import Job


@dataclass(frozen=True)
class GoodputView:
    ettr: float | None
    wall_s: float | None
    productive_s: float | None
    lost: list[tuple[str, float]]
    advice: tuple[str, ...] = field(default=())  # lines of text: the checkpoint interval that fits the job

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


def _goodput_function() -> Callable[[Session, Job], Any] | None:
    try:
        module = importlib.import_module("api.services.goodput")
    except ImportError:
        return None
    for name in ("job_goodput", "for_job", "compute"):
        fn = getattr(module, name, None)
        if callable(fn):
            return fn  # type: ignore[no-any-return]
    return None


def goodput_available() -> bool:
    return _goodput_function() is not None


def _as_mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if hasattr(value, "model_dump"):
        return dict(value.model_dump())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    return {}


def number(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def goodput_of(session: Session, job: Job) -> GoodputView | None:
    fn = _goodput_function()
    if fn is None:
        return None
    data = _as_mapping(fn(session, job))
    if not data:
        return None
    wall = number(data.get("wall_s"))
    productive = number(data.get("productive_s"))
    ettr = number(data.get("ettr"))
    if ettr is None and wall and productive is not None:
        ettr = productive / wall
    nested = next((data[k] for k in ("lost_s", "lost", "breakdown") if isinstance(data.get(k), Mapping)), None)
    if nested is not None:
        items = nested.items()
    else:
        items = ((k, v) for k, v in data.items() if k.endswith("_s") and k not in ("wall_s", "productive_s"))
    lost = []
    for key, value in items:
        seconds = number(value)
        if seconds is not None and seconds > 0:
            lost.append((str(key).removesuffix("_s").replace("_", " "), seconds))
    advice = data.get("advice")
    lines = advice_lines(_as_mapping(advice) if not isinstance(advice, Mapping) else dict(advice))
    return GoodputView(ettr=ettr, wall_s=wall, productive_s=productive, lost=lost, advice=lines)


def _interval(prediction: Any) -> str | None:
    p = _as_mapping(prediction) if not isinstance(prediction, Mapping) else prediction
    seconds = number(p.get("interval_s"))
    if seconds is None:
        return None
    steps = number(p.get("interval_steps"))
    text = f"{steps:.0f} steps ({seconds:.1f} s of training)" if steps is not None else f"{seconds:.1f} s of training"
    ettr = number(p.get("predicted_ettr"))
    return text + (f": predicted ETTR {ettr * 100:.1f} %" if ettr is not None else "")


def advice_lines(advice: Mapping[str, Any]) -> tuple[str, ...]:
    """The advice in words: the interval that fits the job's measured costs, and what the current one gives."""
    if not advice:
        return ()
    lines = []
    optimal = _interval(advice.get("optimal")) if advice.get("optimal") else None
    if optimal:
        c, m, r = (number(advice.get(k)) for k in ("checkpoint_blocking_s", "mtbf_s", "restart_cost_s"))
        basis = ", ".join(
            f"{name} {value:.3g} s" for name, value in (("C", c), ("M", m), ("R", r)) if value is not None
        )
        lines.append(f"Checkpoint every {optimal} (Young/Daly from {basis})")
    current = _interval(advice.get("current")) if advice.get("current") else None
    if current:
        lines.append(f"Now every {current}")
    note = advice.get("note")
    if isinstance(note, str) and note and not optimal:
        lines.append(f"Checkpoint interval advice: {note}")
    return tuple(lines)
