"""Each zero-code progress preset against output captured from its framework (tests/trainer/agent/captured/README.md):
the steps each rank read, the run's total, and the step each run resumed from, as the node agent reads them (the
launcher's output split into rank lines and rounds by LauncherOutput, each rank line read by LineProgress)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ftplane.contract import PROGRESS_PRESETS
from ftplane.trainer.agent.launcher_output import GroupRestarted, LauncherOutput, RankOutput
from ftplane.trainer.agent.line_progress import LineProgress
from ftplane.trainer.agent.presets import PRESETS

CAPTURED = Path(__file__).parent / "captured"


@dataclass
class Run:
    """What one run (launcher round) of the captured output said."""

    starts: list[int | None] = field(default_factory=list)  # each start the reader settled (one per run)
    steps: dict[int, list[int]] = field(default_factory=dict)  # rank -> its steps, in order
    totals: set[int] = field(default_factory=set)


def read(name: str, preset: str | None = None, pattern: str | None = None) -> list[Run]:
    progress = LineProgress(PRESETS[preset] if preset else None, re.compile(pattern) if pattern else None)
    output = LauncherOutput()
    runs = [Run()]
    for line in (CAPTURED / name).read_text().splitlines():
        for fact in output.feed(line):
            if isinstance(fact, GroupRestarted):
                progress.new_round()
                runs.append(Run())
            elif isinstance(fact, RankOutput) and (reading := progress.feed(fact.rank, fact.text)) is not None:
                run = runs[-1]
                if reading.start_known:
                    run.starts.append(reading.start)
                if reading.step is not None:
                    run.steps.setdefault(fact.rank, []).append(reading.step)
                if reading.total is not None:
                    run.totals.add(reading.total)
    return runs


def never_back(run: Run) -> bool:
    return all(a <= b for steps in run.steps.values() for a, b in zip(steps, steps[1:], strict=False))


def test_every_preset_the_contract_names_is_defined() -> None:
    assert set(PRESETS) == set(PROGRESS_PRESETS)


def test_lightning_reads_the_global_step_on_every_rank_from_where_the_run_began() -> None:
    (fresh,) = read("lightning-fresh.log", "lightning")
    assert fresh.starts == [0] and fresh.totals == {30} and never_back(fresh)
    assert set(fresh.steps) == {0, 1} and all(steps[-1] == 30 for steps in fresh.steps.values())
    (resumed,) = read("lightning-resumed.log", "lightning")
    assert resumed.starts == [30] and resumed.totals == {45} and never_back(resumed)
    assert all(steps[0] == 30 and steps[-1] == 45 for steps in resumed.steps.values())


def test_lightning_output_without_the_preset_has_no_step_per_line() -> None:
    """What the preset is for: Lightning's own bar (rich, its output not a terminal) draws once, at the end, the
    batch within the last epoch: no line per step, and a count that is not the global step."""
    (run,) = read("lightning-default.log", pattern=r"(?P<step>\d+)/(?P<total>\d+) ")
    assert run.steps == {0: [10]}  # once, at the end: batch 10 of epoch 1, where the global step was 30
    (preset,) = read("lightning-default.log", "lightning")
    assert preset.steps == {}


def test_transformers_reads_the_training_bar_not_the_evaluation_or_save_bars() -> None:
    (fresh,) = read("transformers-preset-fresh.log", "transformers")
    assert fresh.starts == [0]  # "Running training" and no resume line: it began at 0
    assert fresh.totals == {20} and list(fresh.steps) == [0]  # rank 0's bar alone; evaluation bars (2) left out
    assert never_back(fresh) and 0 not in fresh.steps[0] and fresh.steps[0][-1] == 20
    (resumed,) = read("transformers-preset-resumed.log", "transformers")
    assert resumed.starts == [20] and resumed.totals == {30}
    assert never_back(resumed) and resumed.steps[0][0] > 20 and resumed.steps[0][-1] == 30


def test_transformers_without_the_preset_environment_has_steps_and_total_but_no_start() -> None:
    (run,) = read("transformers-default.log", "transformers")
    assert run.starts == [None]  # the Trainer's info lines are off: where it began is not said, not guessed
    assert run.totals == {30} and never_back(run) and run.steps[0][-1] == 30


def test_torchtitan_reads_training_steps_not_validation_and_where_each_run_starts() -> None:
    first, second = read("torchtitan.log", "torchtitan")
    assert first.starts == [0] and first.steps == {0: [1, 10, 20, 30]} and first.totals == {50}
    assert second.starts == [20] and second.steps == {0: [30, 40, 50]} and second.totals == {50}


def test_megatron_reads_the_last_ranks_iterations_and_rank_0s_resume() -> None:
    first, second = read("megatron.log", "megatron")
    assert first.starts == [0] and first.steps == {3: [5, 10, 15, 20, 25]} and first.totals == {40}
    assert second.starts == [20] and second.steps == {3: [25, 30, 35, 40]} and second.totals == {40}


@pytest.mark.parametrize("name", sorted(p.name for p in CAPTURED.glob("*.log")))
def test_a_plain_pattern_settles_no_start_step(name: str) -> None:
    """A spec's own log_pattern says steps only: the run's start is its first step read, at an unknown step."""
    for run in read(name, pattern=r"(?P<step>\d+)/(?P<total>\d+)"):
        assert run.starts in ([], [None])
