"""ReportBuffer alone (no I/O, no clock of its own): what a node's reports carry and when they go at a job's size
(the retry backoff's ceiling, the spread of a restart's events, the ranks' `running` folded into one per node).
The drivers' tests, over HTTP: test_async_uplink.py and test_uplink.py."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from ftplane import contract
from ftplane.trainer.agent.report_buffer import Outcome, ReportBuffer

STATUS = {"pid": 10, "launcher": {"pid": 11, "alive": True}, "ranks": [], "progress": "sdk", "healthy": True}
BEAT = {"rank": 0, "step": 5, "ts": "2026-01-01T00:00:00+00:00", "node": "node-a"}


def test_the_backoff_stays_at_its_cap_through_a_long_outage() -> None:
    """Past ~1,024 consecutive failures (about an hour at the default cap) 2 ** failures no longer fits a float: the
    exponent is bounded so the sender keeps retrying instead of dying with an OverflowError."""
    buffer = ReportBuffer(backoff_base_s=0.2, backoff_cap_s=5.0)
    buffer.add_event({"key": "k", "type": "rank_failed"})
    for failure in range(3000):
        buffer.settle(buffer.take(float(failure)), Outcome(ok=False, retry=True), float(failure))
        assert 2.5 <= buffer.retry_at - failure <= 5.0 or failure < 5
    assert buffer.failures == 3000 and len(buffer.events) == 1


def test_a_large_jobs_nodes_retry_no_faster_than_they_report() -> None:
    """A 16,384-node job reports every 30 s to stay within its report budget: a control plane that sheds or is away
    must not get a retry from every node every 5 s (six times the budget)."""
    buffer = ReportBuffer(interval_s=30.0, backoff_base_s=0.2, backoff_cap_s=5.0)
    buffer.add_event({"key": "k", "type": "rank_failed"}, now=0.0)
    for failure in range(20):
        buffer.settle(buffer.take(float(failure)), Outcome(ok=False, retry=True), float(failure))
    assert 15.0 <= buffer.retry_at - 19 <= 30.0
    small = ReportBuffer(interval_s=1.0, backoff_base_s=0.2, backoff_cap_s=5.0)
    assert small.backoff_ceiling_s == 5.0


def test_a_large_jobs_nodes_spread_their_events_over_part_of_the_interval() -> None:
    """An event of one node (a rank's failure, a checkpoint): where the interval is 1 s it goes at once; where the
    job's size made the interval 30 s, within 14.5 s, so that the job's nodes do not all report in the same second.
    A flush, the liveness or heartbeats due sooner take the events with them."""
    random.seed(2026)
    small = ReportBuffer(interval_s=1.0)
    small.add_event({"key": "k", "type": "rank_failed"}, now=100.0)
    assert small.due_in(100.0) == 0.0

    waits = []
    for node in range(200):
        buffer = ReportBuffer(interval_s=30.0)
        buffer.add_event({"key": f"k{node}", "type": "rank_failed"}, now=100.0)
        buffer.add_event({"key": f"k{node}-2", "type": "checkpoint_saved"}, now=103.0)  # goes no later
        wait = buffer.due_in(100.0)
        assert wait is not None and 0.0 <= wait <= 14.5
        assert buffer.due_in(100.0 + wait) == 0.0 and buffer.due_in(100.0, flushing=True) == 0.0
        waits.append(wait)
    assert min(waits) < 2.0 and max(waits) > 12.5  # spread over the window, not bunched

    buffer = ReportBuffer(interval_s=30.0)
    buffer.add_event({"key": "k", "type": "rank_failed"}, now=100.0)
    buffer.events_due_at = 110.0
    buffer.add_heartbeat(BEAT)
    buffer.next_report_at = 100.5
    assert buffer.due_in(100.0) == 0.5  # the heartbeats' report takes the event along
    buffer.set_liveness(STATUS)
    assert buffer.due_in(100.0) == 0.0
    report = buffer.take(100.0)
    assert [e["key"] for e in report.events] == ["k"] and report.liveness == STATUS


def test_what_every_node_sends_at_a_restart_goes_with_its_next_liveness() -> None:
    """A restart's `running` and `injob_restart` come from every node of the job at once: past the 1 s interval they
    wait for the node's next liveness (no report of their own), 45 s at most at the 30 s interval for a sender that
    hands over none; an event of the node's own that comes meanwhile takes them along sooner."""
    small = ReportBuffer(interval_s=1.0)
    small.add_event({"key": "r", "type": "running", "rank": 0}, now=100.0)
    assert small.due_in(100.0) == 0.0

    buffer = ReportBuffer(interval_s=30.0)
    buffer.add_event({"key": "restart", "type": "injob_restart", "rank": None}, now=100.0)
    buffer.add_event({"key": "r", "type": "running", "rank": 0, "ts": "2026-01-01T00:00:00+00:00"}, now=100.0)
    assert buffer.due_in(100.0) == 45.0 and buffer.due_in(144.0) == 1.0
    buffer.set_liveness(STATUS)  # the agent's next interval
    report = buffer.take(112.0)
    assert [e["key"] for e in report.events] == ["restart", "r"] and report.liveness == STATUS

    random.seed(7)
    buffer = ReportBuffer(interval_s=30.0)
    buffer.add_event({"key": "r", "type": "running", "rank": 0}, now=100.0)
    buffer.add_event({"key": "f", "type": "rank_failed", "rank": 1}, now=101.0)
    wait = buffer.due_in(101.0)
    assert wait is not None and wait <= 14.5  # the failure is not held back by the `running` before it
    assert [e["key"] for e in buffer.take(101.0 + wait).events] == ["r", "f"]


def test_a_nodes_ranks_running_of_one_run_is_one_event_and_a_sent_event_never_changes() -> None:
    """A restart of a 131,072-rank job is 16,384 `running` events, not 131,072: the node's ranks' `running` of one run
    fold into the first still waiting (its key; every rank and its pid listed; the latest time, the lowest step).
    Another run's, another event's order, and an event already taken for a report stay as they are."""

    def running(rank: int, second: int, iteration: int = 0, step: int = 10) -> dict[str, Any]:
        details = {"restart_count": 1, "iteration": iteration, "start_step": step}
        details |= {"pid": 100 + rank, "local_rank": rank}
        ts = f"2026-01-01T00:00:{second:02d}+00:00"
        return {
            "key": f"run:{iteration}:{rank}",
            "type": "running",
            "ts": ts,
            "rank": rank,
            "step": step,
            "attempt": 0,
            "details": details,
        }

    buffer = ReportBuffer()
    buffer.add_event(running(2, 3))
    buffer.add_event({"key": "ckpt", "type": "checkpoint_loaded", "ts": "2026-01-01T00:00:02+00:00", "rank": 0})
    for rank, second, step in ((0, 5, 10), (1, 4, 10), (3, 1, 9)):
        buffer.add_event(running(rank, second, step=step))
    buffer.add_event(running(0, 9, iteration=1))  # the next in-process iteration: a run of its own
    report = buffer.take(0.0)
    assert [e["key"] for e in report.events] == ["run:0:2", "ckpt", "run:1:0"]
    folded = report.events[0]
    assert (folded["rank"], folded["ts"], folded["step"]) == (2, "2026-01-01T00:00:05+00:00", 9)
    assert folded["details"]["ranks"] == [0, 1, 2, 3]
    assert folded["details"]["processes"] == [{"rank": r, "pid": 100 + r, "local_rank": r} for r in range(4)]
    assert "ranks" not in report.events[2]["details"]

    sent = json.dumps(report.events)
    buffer.add_event(running(1, 11, iteration=1))  # its run's event is on its way: an event of its own
    assert json.dumps(report.events) == sent
    buffer.settle(report, Outcome(ok=True), 1.0)
    assert [e["key"] for e in buffer.take(1.0).events] == ["run:1:1"]


def test_at_exit_what_is_left_is_held_for_part_of_the_interval_past_1_s_and_the_exit_bound_covers_it() -> None:
    now = 1000.0
    assert ReportBuffer(interval_s=30.0).hold_last_flush(now, 95.0) == 0.0  # nothing left: nothing to hold
    fast = ReportBuffer(interval_s=1.0)
    fast.add_event({"key": "k", "type": "rank_failed"}, now=now)
    assert fast.hold_last_flush(now, 10.0) == 0.0 and fast.due_in(now) == 0.0
    holds = []
    for _ in range(200):
        slow = ReportBuffer(interval_s=30.0)
        slow.add_event({"key": "k", "type": "rank_failed"}, now=now)
        hold = slow.hold_last_flush(now, contract.exit_flush_s(30.0, held=True))
        assert slow.due_in(now) == pytest.approx(hold)  # nothing goes before the hold is over
        holds.append(hold)
    assert 0 <= min(holds) < 5 and 25 < max(holds) <= 30  # spread over the interval
    short = ReportBuffer(interval_s=30.0)
    short.add_event({"key": "k", "type": "rank_failed"}, now=now)
    assert short.hold_last_flush(now, 10.0) <= 5.0  # never more than half of the exit's bound
    # the exit's bound: the longest hold (for an agent that holds), then the longest Retry-After, then an answer's 5 s
    assert contract.exit_flush_s(30.0, held=True) == 30 + contract.retry_after_max_s(30.0) + 5
    assert contract.exit_flush_s(30.0) == contract.retry_after_max_s(30.0) + 5  # told to stop: no hold
    assert contract.exit_flush_s(1.0, held=True) == contract.EXIT_FLUSH_MIN_S
