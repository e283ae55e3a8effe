"""Reading the ranks' progress from their output lines (zero-code jobs): the spec's `log_pattern`, or a preset.

Each rank's lines give readings: the steps it has done (a heartbeat at that step), the run's total
(progress and ETA), and once per run, where the output says it, the step the run resumed from (the
agent's `running` then carries it: goodput measures the steps redone from it). Nothing is guessed: a
run whose output does not say where it resumed has no start step.

Within a run (a launcher round) a rank's step never goes back: a lower reading is another counter
(an evaluation's bar, an epoch's batches), not training's, and is dropped. `new_round()` begins the
next run after an in-job restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ftplane.trainer.agent.presets import Preset


@dataclass(frozen=True)
class Reading:
    """What one line said: a rank's steps done (with the run's total where known), and/or where the run began."""

    step: int | None = None
    total: int | None = None
    start: int | None = None  # the run resumed from this step (0: from the beginning)
    start_known: bool = False  # this line settled where the run began (start None: the output does not say)


@dataclass
class _Rank:
    step: int | None = None
    total: int | None = None  # the training's total, once known (a bar of another total is not training's)


@dataclass
class _Run:
    """What the node's ranks have said of the current run."""

    ranks: dict[int, _Rank] = field(default_factory=dict)
    total: int | None = None
    provisional: int | None = None  # where a `begins` or `resumes` line says the run begins, until settled
    settled: bool = False


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.replace(",", ""))
    except ValueError:
        return None


class LineProgress:
    """Feed it each rank's lines; it returns what they say of its progress (see the module's docstring)."""

    def __init__(self, preset: Preset | None = None, pattern: re.Pattern[str] | None = None) -> None:
        if preset is None and pattern is None:
            raise ValueError("a preset or a pattern")
        self.preset = preset
        self.step_pattern = preset.step if preset is not None else pattern
        self._run = _Run()

    def new_round(self) -> None:
        """The ranks were restarted: what follows is a new run."""
        self._run = _Run()

    def steps(self) -> dict[int, int]:
        """Each rank's highest step read in the current run."""
        return {rank: r.step for rank, r in self._run.ranks.items() if r.step is not None}

    def feed(self, rank: int, text: str) -> Reading | None:
        run, preset = self._run, self.preset
        if preset is not None:
            start = self._start_line(preset, text)
            if start is not None:
                return start
            if preset.total is not None and (m := preset.total.search(text)):
                run.total = _number(m["total"]) or run.total
        assert self.step_pattern is not None
        match = self.step_pattern.search(text)
        if match is None:
            return None
        step = _number(match["step"])
        groups = match.groupdict()
        total = _number(groups.get("total")) or run.total
        if step is None:
            return None
        held = run.ranks.setdefault(rank, _Rank())
        if preset is not None and preset.bar:
            if held.total is None:
                held.total = run.total or total
            if total != held.total:
                return None  # another bar: an evaluation, a save
            if step == 0:
                return None  # a bar just made, even where the run resumed further on
        if held.step is not None and step < held.step:
            return None  # not training's counter: steps do not go back within a run
        held.step = step
        reading = Reading(step=step, total=total)
        if not run.settled:
            run.settled = True
            first = step if preset is not None and preset.first_is_start else run.provisional
            reading = Reading(step=step, total=total, start=first, start_known=True)
        return reading

    def _start_line(self, preset: Preset, text: str) -> Reading | None:
        """A line that says where the run begins: settled at once (a resume), or held until it is."""
        run = self._run
        if run.settled:
            return None
        if preset.resumes is not None and (m := preset.resumes.search(text)):
            groups = m.groupdict()
            start = _number(groups.get("step"))
            if start is None and (following := _number(groups.get("next"))) is not None:
                start = max(following - 1, 0)
            run.provisional, run.settled = start, True
            return Reading(start=start, start_known=True)
        if preset.begins is not None and preset.begins.search(text):
            if preset.settles_at_begin:
                run.settled = True
                return Reading(start=run.provisional if run.provisional is not None else 0, start_known=True)
            run.provisional = 0
        return None
