"""The reputation rule over generated fault sequences (hypothesis): what it says of any history, stated apart from
how rule.py computes it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from api.schemas.fleet_nodes import COUNTED_KINDS, FaultKind, NodeState
from api.services.node_reputation.rule import Fault, Rule, Standing, judge

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
RULE = Rule(quarantine_jobs=2, window=timedelta(hours=24), quarantine=timedelta(hours=6))
ORDER = {NodeState.healthy: 0, NodeState.suspect: 1, NodeState.quarantined: 2}

faults = st.builds(
    Fault,
    job_id=st.sampled_from(["job-a", "job-b", "job-c", "job-d"]),
    kind=st.sampled_from(list(FaultKind)),
    ts=st.integers(min_value=-72 * 60, max_value=0).map(lambda m: NOW + timedelta(minutes=m)),
    attempt=st.integers(min_value=0, max_value=3),
)
histories = st.lists(faults, max_size=12)
rules = st.builds(
    Rule,
    quarantine_jobs=st.integers(min_value=0, max_value=4),
    window=st.integers(min_value=1, max_value=72).map(lambda h: timedelta(hours=h)),
    quarantine=st.integers(min_value=1, max_value=48).map(lambda h: timedelta(hours=h)),
)


def expected_state(history: list[Fault], rule: Rule, forgiven: datetime | None = None) -> NodeState:
    """The rule in its own words: counted kinds, inside the window, after the release; different jobs."""
    counting = [
        f
        for f in history
        if f.kind in COUNTED_KINDS and f.ts > NOW - rule.window and (forgiven is None or f.ts > forgiven)
    ]
    if rule.quarantine_jobs and len({f.job_id for f in counting}) >= rule.quarantine_jobs:
        return NodeState.quarantined
    return NodeState.suspect if counting else NodeState.healthy


@settings(max_examples=300, deadline=None)
@given(history=histories, rule=rules)
def test_a_healthy_nodes_state_is_the_rule_over_its_faults(history: list[Fault], rule: Rule) -> None:
    judged = judge(Standing(NodeState.healthy, NOW - timedelta(days=9)), history, NOW, rule)
    assert judged.standing.state == expected_state(history, rule)
    if judged.standing.state == NodeState.quarantined:
        assert judged.changes == ("quarantined",) and judged.standing.quarantined_until == NOW + rule.quarantine
        assert judged.counted[-1].ts == max(f.ts for f in judged.counted)  # the fault that tipped it: the newest


@settings(max_examples=300, deadline=None)
@given(history=histories, extra=st.lists(faults, max_size=4))
def test_preemptions_and_injected_faults_never_move_the_state(history: list[Fault], extra: list[Fault]) -> None:
    apart = [f for f in extra if f.kind not in COUNTED_KINDS]
    start = Standing(NodeState.healthy, NOW - timedelta(days=9))
    assert judge(start, history, NOW, RULE).standing == judge(start, history + apart, NOW, RULE).standing


@settings(max_examples=300, deadline=None)
@given(history=histories, more=faults)
def test_one_more_fault_never_makes_a_node_look_better(history: list[Fault], more: Fault) -> None:
    start = Standing(NodeState.healthy, NOW - timedelta(days=9))
    before = judge(start, history, NOW, RULE).standing.state
    after = judge(start, [*history, more], NOW, RULE).standing.state
    assert ORDER[after] >= ORDER[before]


@settings(max_examples=200, deadline=None)
@given(history=st.lists(faults.filter(lambda f: f.job_id == "job-a"), max_size=12))
def test_one_jobs_faults_alone_never_quarantine(history: list[Fault]) -> None:
    judged = judge(Standing(), history, NOW, RULE)
    assert judged.standing.state != NodeState.quarantined


@settings(max_examples=300, deadline=None)
@given(history=histories, hours=st.integers(min_value=0, max_value=12))
def test_a_quarantine_lasts_its_time_then_forgives_what_led_to_it(history: list[Fault], hours: int) -> None:
    began = NOW - timedelta(hours=hours)
    held = Standing(NodeState.quarantined, began, began + RULE.quarantine, None, "quarantined: ...")
    judged = judge(held, history, NOW, RULE)
    if began + RULE.quarantine > NOW:
        assert judged.standing == held and judged.changes == ()
        return
    assert judged.changes[0] == "released"
    assert judged.standing.forgiven_before == began
    assert judged.standing.state == expected_state(history, RULE, forgiven=began)


def test_quarantine_off() -> None:
    history = [Fault(job, FaultKind.lost, NOW - timedelta(minutes=5)) for job in ("a", "b", "c")]
    judged = judge(Standing(), history, NOW, Rule(quarantine_jobs=0))
    assert judged.standing.state == NodeState.suspect


def test_suspect_decays_to_healthy_once_its_faults_leave_the_window() -> None:
    history = [Fault("a", FaultKind.xid, NOW - timedelta(hours=30))]
    judged = judge(Standing(NodeState.suspect, NOW - timedelta(hours=30)), history, NOW, RULE)
    assert judged.standing.state == NodeState.healthy and judged.changes == ("healthy",)
