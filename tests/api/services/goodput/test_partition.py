"""Any history of events, however odd: the goodput buckets partition its wall time (hypothesis)."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from api.services.goodput import Record, account
from tests.api.services.goodput.test_accounting import assert_partition, at

KINDS = [
    "running",
    "checkpoint_saved",
    "fault_injected",
    "rank_failed",
    "hang_detected",
    "inprocess_restart",
    "injob_restart",
    "job_restart",
    "submitted",
]


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Record], float]:
    n = draw(st.integers(0, 25))
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(KINDS))
        t = draw(st.floats(0, 500, allow_nan=False))
        attempt = draw(st.integers(0, 3))
        step = draw(st.one_of(st.none(), st.integers(0, 1000)))
        details: dict[str, Any] = {}
        if kind == "running":
            details = {"restart_count": draw(st.integers(0, 3)), "iteration": draw(st.integers(0, 2))}
            details["start_step"] = draw(st.integers(0, 1000))
            if draw(st.booleans()):
                details["source"] = "agent"  # the node agent's word for ranks that did not say it
        elif kind == "checkpoint_saved":
            details = {"step": step, "blocking_s": draw(st.floats(0, 30)), "total_s": draw(st.floats(0, 60))}
        elif kind == "hang_detected":
            details = {"silent_s": draw(st.floats(0, 100))}
        elif kind == "injob_restart":
            details = {"restart_count": draw(st.integers(0, 4)), "failed_step": step}
        elif kind == "inprocess_restart":
            details = {"iteration": draw(st.integers(0, 3)), "restart_count": draw(st.integers(0, 3))}
        elif kind == "job_restart":
            details = {"from_attempt": max(0, attempt - 1)}
        elif kind == "rank_failed" and draw(st.booleans()):
            details = {"source": "launcher"}
        out.append(Record(kind, at(t), attempt, step, details))
    if draw(st.booleans()):
        out.append(Record(draw(st.sampled_from(["succeeded", "failed", "cancelled"])), at(draw(st.floats(0, 600))), 0))
    return out, draw(st.floats(0, 700))


@settings(max_examples=300, deadline=None)
@given(histories())
def test_any_history_is_partitioned(case: tuple[list[Record], float]) -> None:
    records, now = case
    g = account(records, now=at(now), interval_steps=100)
    assert_partition(g)
    assert math.isfinite(g.wall_s)
