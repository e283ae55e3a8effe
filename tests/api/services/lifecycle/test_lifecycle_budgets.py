"""The ladder's budgets besides max_job_restarts: preemptions have a bounded budget of their own, and a pending
timeout retries or fails the job as the spec says."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from api.schemas.causes import Cause, CauseClass
from api.schemas.spec import JobSpec
from api.services import lifecycle
from api.services.lifecycle import Failure, RungName

SPEC = JobSpec.model_validate(
    {"name": "t", "command": ["true"], "resiliency": {"max_job_restarts": 1, "max_preemptions": 2}}
)
PREEMPTED = Cause(CauseClass.preempted, "pod evicted on node n1: the node is being drained", {"node": "n1"})
CRASH = Cause(CauseClass.crash, "exit code 1")
PENDING = Cause(CauseClass.scheduling, "not running 600 s after launch", {"reason": lifecycle.PENDING_TIMEOUT})


def job_with(**fields: Any) -> Any:
    return SimpleNamespace(**{"excluded_nodes": [], "failure_steps": [], "job_restarts": 0, **fields})


def spec(**resiliency: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "t", "command": ["true"], "resiliency": resiliency})


def test_a_preemption_restarts_from_its_own_budget_even_when_max_job_restarts_is_spent() -> None:
    # one crash restart already made: max_job_restarts (1) is spent
    decision = lifecycle.next_rung(job_with(job_restarts=1), SPEC, Failure(PREEMPTED, ("n1",)), preemptions=0)
    assert decision.rung is not None and decision.rung.name == RungName.job
    assert decision.exclude == ("n1",) and decision.cause == PREEMPTED


def test_the_preemption_budget_is_bounded() -> None:
    decision = lifecycle.next_rung(job_with(job_restarts=2), SPEC, Failure(PREEMPTED), preemptions=2)
    assert decision.gives_up and decision.cause.cause_class == CauseClass.preempted
    assert decision.cause.message.endswith("; preemption budget (2) spent")
    none_allowed = lifecycle.next_rung(job_with(), spec(max_preemptions=0), Failure(PREEMPTED), preemptions=0)
    assert none_allowed.gives_up


def test_preemption_restarts_are_not_charged_to_max_job_restarts() -> None:
    # three job restarts so far, two of them after preemptions: one is charged, the budget of 1 is spent
    spent = lifecycle.next_rung(job_with(job_restarts=3), SPEC, Failure(CRASH), preemptions=2)
    assert spent.gives_up and spent.cause.message == "exit code 1; job restart budget (1) spent"
    # two job restarts, both after preemptions: nothing charged, the crash restarts
    fresh = lifecycle.next_rung(job_with(job_restarts=2), SPEC, Failure(CRASH), preemptions=2)
    assert not fresh.gives_up


def test_preemptions_at_the_same_step_are_not_a_loop_without_progress() -> None:
    stuck = job_with(failure_steps=[7, 7, 7])
    assert lifecycle.next_rung(stuck, SPEC, Failure(CRASH)).cause.cause_class == CauseClass.no_progress
    assert not lifecycle.next_rung(stuck, SPEC, Failure(PREEMPTED)).gives_up


def test_a_pending_timeout_retries_or_fails_as_the_spec_says() -> None:
    retry = lifecycle.next_rung(job_with(), spec(max_job_restarts=1), Failure(PENDING))
    assert not retry.gives_up
    fail = lifecycle.next_rung(job_with(), spec(max_job_restarts=1, on_pending_timeout="fail"), Failure(PENDING))
    assert fail.gives_up and fail.cause.cause_class == CauseClass.scheduling
    assert fail.cause.message.endswith("; resiliency.on_pending_timeout is fail")
    # other scheduling failures (an image that cannot be pulled) are not the timeout's: they take the ladder
    unpullable = Cause(CauseClass.scheduling, "image cannot be pulled", {"reason": "ImagePullBackOff"})
    assert not lifecycle.next_rung(job_with(), spec(on_pending_timeout="fail"), Failure(unpullable)).gives_up


def test_the_verdict_still_ends_the_job_at_once() -> None:
    verdict = Cause(CauseClass.verdict, "ft_launcher exited 93")
    assert lifecycle.next_rung(job_with(), SPEC, Failure(verdict), preemptions=0).gives_up


def test_an_image_that_cannot_run_the_pods_ends_the_job_at_once() -> None:
    broken = Cause(CauseClass.launch, "the image cannot run this pod: its efa-check check failed (exit code 78)")
    assert lifecycle.next_rung(job_with(), SPEC, Failure(broken)).gives_up
