"""The agent's uplink against a real HTTP receiver: delivery, idempotent retries, coalescing, refusals, and that
what the node hands it never waits on the network."""

from __future__ import annotations

import logging
import statistics
import time
from datetime import datetime
from typing import Any

import pytest

from ftplane.trainer.agent.uplink import Uplink
from tests.support.waiting import wait_for
from tests.trainer.conftest import TOKEN, Receiver
from tests.trainer.conftest import receiver as receiver  # noqa: F401 - the stand-in control plane fixture


def make(receiver: Receiver, **kwargs: Any) -> Uplink:
    kwargs.setdefault("interval_s", 0.05)
    kwargs.setdefault("backoff_base_s", 0.05)
    kwargs.setdefault("backoff_cap_s", 0.5)
    return Uplink(receiver.url, receiver.job_id, 3, receiver.token, "node-a", **kwargs)


def beat(rank: int, step: int, **extra: Any) -> dict[str, Any]:
    return {"rank": rank, "step": step, "node": "node-a", **extra}


def test_without_url_everything_is_a_no_op() -> None:
    uplink = Uplink(None, None, 0, None, "node-a")
    assert not uplink.enabled
    key = uplink.event("running", rank=0)
    uplink.heartbeat(beat(0, 1))
    assert key and uplink.flush(0.1) and uplink.pending() == (0, 0)
    assert uplink.close(0.1)


def test_events_arrive_in_order_with_the_contract_fields(receiver: Receiver) -> None:
    uplink = make(receiver)
    keys = [uplink.event("checkpoint_saved", rank=0, step=i, details={"step": i}) for i in range(50)]
    assert uplink.close(10)
    assert receiver.event_order == keys
    event = receiver.events[keys[7]]
    assert event["type"] == "checkpoint_saved" and event["attempt"] == 3 and event["node"] == "node-a"
    assert event["rank"] == 0 and event["step"] == 7 and event["details"] == {"step": 7}
    assert datetime.fromisoformat(event["ts"]).tzinfo is not None


def test_heartbeats_are_coalesced_to_the_newest_per_rank_and_liveness_rides_along(receiver: Receiver) -> None:
    uplink = make(receiver, interval_s=0.5)
    for step in range(1, 2001):
        uplink.heartbeat(beat(step % 2, step, throughput=100.0))
    uplink.liveness({"pid": 1, "ranks": [{"rank": 0, "alive": True}], "progress": "sdk"})
    assert uplink.close(10)
    with receiver.lock:
        beats = list(receiver.heartbeats)
        reports = list(receiver.reports)
    assert len(beats) < 20  # 2000 handed over, a handful sent
    newest = {rank: max(b["step"] for b in beats if b["rank"] == rank) for rank in (0, 1)}
    assert newest == {0: 2000, 1: 1999}
    assert reports[-1]["node"] == "node-a" and reports[-1]["progress"] == "sdk"


def test_retries_reuse_the_key_so_a_lost_reply_is_stored_once(receiver: Receiver) -> None:
    receiver.lose_replies = 2
    receiver.fail_with = [503, 500, 429]
    uplink = make(receiver)
    keys = [uplink.event("rank_failed", rank=1, details={"n": i}) for i in range(3)]
    assert uplink.close(15)
    assert receiver.event_order == keys
    assert receiver.duplicates >= 2  # the report was sent again after each lost reply...
    assert len(receiver.events) == 3  # ...and each event stored once
    statuses = [status for path, status in receiver.requests if path.endswith("/reports")]
    assert statuses[:5] == [503, 500, 429, 503, 503] and statuses[-1] == 200


def test_retry_after_is_honoured(receiver: Receiver) -> None:
    receiver.fail_with = [503]
    receiver.retry_after = "1.5"
    uplink = make(receiver)
    started = time.monotonic()
    uplink.event("running", rank=0)
    wait_for("the event", lambda: receiver.events, 10, interval=0.05)
    assert time.monotonic() - started >= 1.4
    uplink.close(5)


@pytest.mark.parametrize("status", [401, 403, 404, 422])
def test_refused_reports_are_dropped_not_retried_forever(
    receiver: Receiver, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.fail_with = [status]
    uplink = make(receiver)
    with caplog.at_level(logging.WARNING, logger="ftplane.trainer.agent.uplink"):
        uplink.event("running", rank=0)
        assert uplink.flush(5)  # dropped: nothing pending
        uplink.event("checkpoint_saved", rank=0, step=5)
        assert uplink.close(5)
    assert [e["type"] for e in receiver.events.values()] == ["checkpoint_saved"]
    assert len([s for _, s in receiver.requests if s == status]) == 1
    assert f"HTTP {status}" in caplog.text and TOKEN not in caplog.text


def test_a_wrong_token_is_refused_and_never_logged(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    secret = "wrong-secret-token-123"
    uplink = Uplink(receiver.url, receiver.job_id, 0, secret, "node-a", interval_s=0.05)
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="ftplane.trainer.agent.uplink"):
        uplink.event("running", rank=0)
        uplink.heartbeat(beat(0, 1))
        assert uplink.close(5)
    assert not receiver.events and not receiver.heartbeats
    assert "HTTP 401" in caplog.text and secret not in caplog.text


def test_fault_directives_in_replies_reach_the_callback(receiver: Receiver) -> None:
    receiver.faults = [{"id": "f-1", "kind": "crash", "rank": 1, "at_step": None, "delivery": "agent"}]
    seen: list[dict[str, Any]] = []
    uplink = make(receiver, on_faults=seen.extend)
    uplink.heartbeat(beat(1, 3))
    wait_for("the fault directive", lambda: seen, 5, interval=0.05)
    assert seen[0]["id"] == "f-1" and seen[0]["delivery"] == "agent"
    uplink.close(5)


def test_handing_over_never_waits_on_a_slow_control_plane(receiver: Receiver) -> None:
    receiver.delay_s = 2.0  # every request takes 2 s to answer
    uplink = make(receiver, interval_s=0.01)
    took = []
    for step in range(20000):
        started = time.perf_counter()
        uplink.heartbeat(beat(0, step, throughput=1.0, loss=0.5))
        if step % 100 == 0:
            uplink.event("checkpoint_saved", rank=0, step=step)
        took.append(time.perf_counter() - started)
    took.sort()
    assert took[-1] < 0.5, f"a hand-over took {took[-1] * 1000:.1f} ms"
    assert took[int(len(took) * 0.99)] < 0.005 and statistics.mean(took) < 0.0005
    receiver.delay_s = 0.0
    assert uplink.close(15)
    assert len(receiver.of_type("checkpoint_saved")) == 200


def test_flush_is_bounded_when_the_control_plane_is_down(receiver: Receiver) -> None:
    receiver.stop()
    uplink = make(receiver)
    uplink.event("fault_injected", rank=0)
    started = time.monotonic()
    assert uplink.flush(0.5) is False
    assert time.monotonic() - started < 1.5
    assert uplink.pending() == (1, 0)
    receiver.start()
    assert uplink.close(10)
    assert receiver.types() == ["fault_injected"]
