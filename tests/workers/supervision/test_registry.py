"""The duty registry (`workers.supervision.DUTIES`) is the one list: every duty module is in it, and Celery's
beat schedule and registered tasks hold exactly its duties, each under its own name."""

from __future__ import annotations

import importlib
from pathlib import Path

from celery import Celery

import workers.supervision
from api.core.config import Settings
from workers.celery_app import TASK_MODULES, celery_app, configure
from workers.supervision import DUTIES

DUTY_TASKS = {duty.task for duty in DUTIES}


def registered_tasks() -> dict[str, str]:
    """Every task the worker registers (its task modules imported, as a worker does): name -> defining module."""
    for module in TASK_MODULES:
        importlib.import_module(module)
    return {name: type(task).__module__ for name, task in celery_app.tasks.items() if not name.startswith("celery.")}


def test_the_registry_names_each_duty_once() -> None:
    names = [duty.name for duty in DUTIES]
    assert len(names) == len(set(names))
    assert len({duty.beat_entry for duty in DUTIES}) == len(DUTIES)


def test_every_duty_module_is_in_the_registry() -> None:
    """A module of workers/supervision/ with a `run_once` pass is a duty: the registry runs its pass."""
    passes = {duty.run_once for duty in DUTIES}
    package = Path(workers.supervision.__file__).parent
    for path in sorted(package.glob("*.py")):
        if path.stem == "__init__":
            continue
        module = importlib.import_module(f"workers.supervision.{path.stem}")
        run_once = getattr(module, "run_once", None)
        if run_once is not None:
            assert run_once in passes, f"workers/supervision/{path.name} has a run_once that no duty runs"


def test_the_beat_schedule_runs_exactly_the_duties() -> None:
    schedule = celery_app.conf.beat_schedule
    duty_entries = {name: entry["task"] for name, entry in schedule.items() if entry["task"] in DUTY_TASKS}
    assert duty_entries == {duty.beat_entry: duty.task for duty in DUTIES}
    # the other entries are housekeeping, each a registered task that is no duty
    others = {entry["task"] for name, entry in schedule.items() if name not in duty_entries}
    assert others and not others & DUTY_TASKS
    assert others <= set(registered_tasks())


def test_each_duty_runs_at_its_period(tmp_path: Path) -> None:
    """The fleet's ledgers at the fleet's period, every other duty at the supervision period."""
    settings = Settings(supervise_interval_s=0.5, fleet_interval_s=7.0, data_dir=tmp_path)
    app = Celery("registry-test")
    configure(app, settings)
    schedule = {duty.name: app.conf.beat_schedule[duty.beat_entry]["schedule"] for duty in DUTIES}
    fleet = {"judge_nodes", "summarize_goodput", "evaluate_objectives"}
    assert {name for name, period in schedule.items() if period == 7.0} == fleet
    assert all(period == 0.5 for name, period in schedule.items() if name not in fleet)


def test_the_registered_duty_tasks_are_exactly_the_duties() -> None:
    tasks = registered_tasks()
    assert {name for name, module in tasks.items() if module == "workers.tasks.duties"} == DUTY_TASKS
