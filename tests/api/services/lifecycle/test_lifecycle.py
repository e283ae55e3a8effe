"""The lifecycle's transition tables and its ladder, as data: what each status may become, and what a failure
leads to."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from api.services import lifecycle
from api.services.lifecycle import (
    ALLOWED,
    ATTEMPT_ALLOWED,
    ATTEMPT_ENDED,
    TERMINAL,
    AttemptStatus,
    Failure,
    InvalidTransition,
    JobStatus,
    RungName,
)


def reachable(table: dict[Any, frozenset[Any]], start: Any) -> set[Any]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_job_transition_table() -> None:
    assert set(ALLOWED) == set(JobStatus)
    for status in TERMINAL:
        assert ALLOWED[status] == frozenset(), f"{status} is terminal: nothing may follow it"
    for status in set(JobStatus) - TERMINAL:
        assert reachable(ALLOWED, status) >= TERMINAL, f"{status} must be able to end every way"
        assert JobStatus.PENDING not in ALLOWED[status], "nothing goes back to PENDING"
    assert ALLOWED[JobStatus.RUNNING] >= {JobStatus.RECOVERING} and JobStatus.RUNNING in ALLOWED[JobStatus.RECOVERING]


def test_attempt_transition_table() -> None:
    assert set(ATTEMPT_ALLOWED) == set(AttemptStatus)
    for status in ATTEMPT_ENDED:
        assert ATTEMPT_ALLOWED[status] == frozenset()
    assert reachable(ATTEMPT_ALLOWED, AttemptStatus.PENDING) == set(AttemptStatus)
    assert AttemptStatus.SUCCEEDED not in ATTEMPT_ALLOWED[AttemptStatus.PENDING], "an unlaunched attempt can't succeed"


@pytest.mark.parametrize("current, to", list(itertools.product(JobStatus, JobStatus)))
def test_transition_obeys_the_table(current: JobStatus, to: JobStatus) -> None:
    job = SimpleNamespace(id="j", status=current.value, updated_at=None, status_reason=None, started_at=None)
    if current == to:
        assert lifecycle.transition(None, job, to) is False  # type: ignore[arg-type]
    elif to not in ALLOWED[current]:
        with pytest.raises(InvalidTransition):
            lifecycle.transition(None, job, to)  # type: ignore[arg-type]
        assert job.status == current.value
    elif to not in TERMINAL:  # terminal ones record an event: covered by the API tests
        assert lifecycle.transition(None, job, to) is True  # type: ignore[arg-type]
        assert job.status == to.value


@pytest.mark.parametrize("current, to", list(itertools.product(AttemptStatus, sorted(ATTEMPT_ENDED))))
def test_finish_attempt_obeys_the_table(current: AttemptStatus, to: AttemptStatus) -> None:
    attempt = SimpleNamespace(job_id="j", number=0, status=current.value, cause=None, finished_at=None)
    if current in ATTEMPT_ENDED:
        lifecycle.finish_attempt(attempt, to)  # type: ignore[arg-type]
        assert attempt.status == current.value  # an ended attempt stays as it ended
    elif to in ATTEMPT_ALLOWED[current]:
        lifecycle.finish_attempt(attempt, to, Cause(CauseClass.crash, "exit code 1"))  # type: ignore[arg-type]
        assert attempt.status == to.value and attempt.cause == "exit code 1" and attempt.finished_at is not None
    else:
        with pytest.raises(InvalidTransition):
            lifecycle.finish_attempt(attempt, to)  # type: ignore[arg-type]


SPEC = JobSpec.model_validate(
    {"name": "t", "command": ["true"], "resiliency": {"max_job_restarts": 2, "max_in_job_restarts": 5}}
)
CRASH = Cause(CauseClass.crash, "exit code 137", {"exit_code": 137})


def job_with(**fields: Any) -> Any:
    return SimpleNamespace(**{"excluded_nodes": [], "failure_steps": [], "job_restarts": 0, **fields})


def test_the_ladder_is_data_with_budgets_from_the_spec() -> None:
    assert [r.name for r in lifecycle.LADDER] == [RungName.inprocess, RungName.in_job, RungName.job]
    assert lifecycle.budgets(SPEC) == lifecycle.Budgets(inprocess=0, in_job=5, job=2)
    on = SPEC.model_copy(update={"resiliency": SPEC.resiliency.model_copy(update={"inprocess": {"enabled": True}})})
    assert lifecycle.budgets(JobSpec.model_validate(on.model_dump())).inprocess == 10


def test_next_rung_restarts_within_the_budget_excluding_new_nodes() -> None:
    decision = lifecycle.next_rung(job_with(excluded_nodes=["n1"]), SPEC, Failure(CRASH, ("n1", "n2", "n2")))
    assert decision.rung is not None and decision.rung.name == RungName.job
    assert decision.exclude == ("n2",) and decision.cause == CRASH


def test_next_rung_gives_up_when_the_budget_is_spent() -> None:
    decision = lifecycle.next_rung(job_with(job_restarts=2), SPEC, Failure(CRASH))
    assert decision.gives_up and decision.cause.cause_class == CauseClass.crash
    assert decision.cause.message == "exit code 137; job restart budget (2) spent"


def test_next_rung_gives_up_on_a_loop_without_progress_unless_the_job_moves() -> None:
    stuck = job_with(failure_steps=[7, 7, 7])
    decision = lifecycle.next_rung(stuck, SPEC, Failure(CRASH))
    assert decision.gives_up and decision.cause.cause_class == CauseClass.no_progress
    assert "last cause: exit code 137" in decision.cause.message
    moved = lifecycle.next_rung(stuck, SPEC, Failure(CRASH, ("n9",)))
    assert not moved.gives_up and moved.exclude == ("n9",)


def test_next_rung_gives_up_at_once_on_the_resiliency_librarys_own_verdict() -> None:
    verdict = Cause(CauseClass.verdict, "ft_launcher exited 93: no progress")
    assert lifecycle.next_rung(job_with(), SPEC, Failure(verdict)).gives_up
