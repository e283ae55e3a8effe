"""What an announcement carries: a job-wide hang once per batch with its ranks and nodes (listed up to a bound),
and the cause class next to the cause."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from standardwebhooks import Webhook

from api.schemas.events import utcnow
from tests.api.webhooks.test_delivery import Enqueued, subscribe
from tests.support.embedded_app import post_events, start
from tests.support.receivers import Receiver
from workers.tasks.webhooks import deliver_webhook


def test_a_job_wide_hang_is_announced_once_per_batch_with_its_ranks_and_nodes(
    admin: TestClient, receiver: Receiver, make_job: Callable[..., dict[str, Any]], enqueued: Enqueued
) -> None:
    hook = subscribe(admin, receiver)
    slack = subscribe(admin, receiver, "/slack", format="slack")
    job = make_job()
    start(job)
    hangs = [  # as the supervisor stores a job-wide hang: one event per node, naming its silent ranks
        {
            "key": f"h{node}",
            "type": "hang_detected",
            "rank": 3 * node,
            "node": f"node-{node}",
            "step": 40,
            "details": {"ranks": [3 * node, 3 * node + 1, 3 * node + 2]},
        }
        for node in range(2)
    ]
    stored = post_events(admin, job, *hangs, {"key": "restart", "type": "injob_restart", "rank": 2})
    assert stored["stored"] == 3  # every node's hang is kept (goodput and the dashboard read them)
    assert len(enqueued) == 4  # one hang announcement and one restart, to each of two subscriptions
    for delivery_id, _ in enqueued:
        assert deliver_webhook(delivery_id) == "delivered"

    hang, restart = (Webhook(hook["secret"]).verify(got.body, got.headers) for got in receiver.at("/hook"))
    assert (hang["type"], hang["data"]["event"]["rank"], restart["type"]) == ("hang_detected", 0, "injob_restart")
    assert hang["data"]["affected"] == {
        "events": 2,
        "rank_count": 6,
        "node_count": 2,
        "ranks": [0, 1, 2, 3, 4, 5],
        "nodes": ["node-0", "node-1"],
        "truncated": False,
    }
    assert "affected" not in restart["data"]
    message = Webhook(slack["secret"]).verify(receiver.at("/slack")[0].body, receiver.at("/slack")[0].headers)
    assert "hang detected" in message["text"] and "(6 ranks on 2 node(s))" in message["text"]

    # A rank found silent on a later pass is a new announcement, of itself alone.
    post_events(admin, job, {"key": "h9", "type": "hang_detected", "rank": 9, "node": "node-3"})
    assert len(enqueued) == 6
    deliver_webhook(enqueued[4][0])
    later = Webhook(hook["secret"]).verify(receiver.at("/hook")[-1].body, receiver.at("/hook")[-1].headers)
    assert later["data"]["affected"] == {
        "events": 1,
        "rank_count": 1,
        "node_count": 1,
        "ranks": [9],
        "nodes": ["node-3"],
        "truncated": False,
    }


def test_the_ranks_of_a_huge_hang_are_listed_up_to_a_bound() -> None:
    from api.database.tables import Event
    from api.webhooks.messages import AFFECTED_LISTED
    from api.webhooks.outbox import announcements

    now = utcnow()
    hangs = [
        Event(id=i, type="hang_detected", attempt=0, rank=i, node=f"n{i // 8}", ts=now, details={}) for i in range(1000)
    ]
    other = Event(id=5000, type="job_restart", attempt=0, rank=None, node=None, ts=now, details={})
    announced = announcements([*hangs[:500], other, *hangs[500:]])
    assert [(first.id, len(together)) for first, together in announced] == [(0, 1000), (5000, 1)]

    from api.webhooks.messages import _affected

    affected = _affected(announced[0][1])
    assert (affected["events"], affected["rank_count"], affected["node_count"]) == (1000, 1000, 125)
    assert affected["truncated"]
    assert affected["ranks"] == list(range(AFFECTED_LISTED)) and len(affected["nodes"]) == AFFECTED_LISTED


@pytest.mark.parametrize(
    ("details", "stated"),
    [
        ({"cause": "exit code 137", "cause_class": "crash"}, "crash"),
        ({"cause": "exit code 137"}, "unknown"),  # the sentence is never read for a class
        ({"cause": "worker group failed", "cause_class": "made-up"}, "other"),
        ({"restart_count": 1}, None),
    ],
)
def test_the_payload_states_the_cause_class_next_to_the_cause(details: dict[str, Any], stated: str | None) -> None:
    from api.database.tables import Event, Job
    from api.webhooks.messages import standard_payload

    job = Job(id="j1", name="tiny", status="RECOVERING", attempt=0, labels={})
    event = Event(id=1, type="injob_restart", attempt=0, ts=utcnow(), details=details)
    sent = standard_payload(job, event)["data"]["event"]["details"]
    assert sent.get("cause_class") == stated and sent.get("cause") == details.get("cause")
