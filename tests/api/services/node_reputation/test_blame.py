"""Which event blames which node as what (api/services/node_reputation/blame.py), read from the events' facts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from api.database.tables import Event
from api.schemas.fleet_nodes import FaultKind
from api.services.node_reputation.blame import blame

NODE = "ip-10-0-1-5"


def event(
    type_: str, node: str | None = NODE, attempt: int = 0, details: dict[str, Any] | None = None, **more: Any
) -> Event:
    details = {**(details or {}), **more}
    return Event(
        id=1, job_id="j", attempt=attempt, type=type_, ts=datetime.now(UTC), node=node, rank=2, details=details, key="k"
    )


@pytest.mark.parametrize(
    ("made", "kind", "counted"),
    [
        (event("node_failed", reason="NodeLost"), FaultKind.lost, True),
        (
            event("node_unhealthy", cause="GPU 1: critical Xid error(s) [79]", source="gpu", gpu=1, xid=[79]),
            FaultKind.xid,
            True,
        ),
        (event("node_unhealthy", cause="GPU 0: 2 new", source="gpu", gpu=0, ecc_new=2), FaultKind.ecc, True),
        (event("node_unhealthy", cause="Ready=False: KubeletNotReady", condition="Ready"), FaultKind.unhealthy, True),
        (event("preempted", reason="EvictionByEvictionAPI"), FaultKind.preempted, False),
        (event("straggler_detected", episode="e7", score=0.6), FaultKind.straggler, True),
        (
            event("node_excluded", attempt=2, details={"cause_class": "node", "node": NODE, "from_attempt": 1}),
            FaultKind.lost,
            True,
        ),
    ],
)
def test_each_blaming_event(made: Event, kind: FaultKind, counted: bool) -> None:
    found = blame(made)
    assert found is not None and found.kind == kind and found.counted == counted and found.node == NODE


def test_what_blames_no_node() -> None:
    assert blame(event("rank_failed", exit_code=1)) is None  # a rank's failure: its code's, not the node's
    assert blame(event("node_failed", node=None)) is None
    assert blame(event("node_failed", node="Not A Name")) is None
    assert (
        blame(event("node_excluded", details={"cause_class": "crash", "node": "elsewhere", "from_attempt": 0})) is None
    )
    assert blame(event("node_excluded", details={"cause_class": "straggler", "node": NODE, "from_attempt": 0})) is None
    assert blame(event("node_unhealthy", xid=["79"], source="gpu")).kind == FaultKind.unhealthy  # type: ignore[union-attr]


def test_one_failure_of_an_attempt_is_one_key_and_each_episode_its_own() -> None:
    lost, unhealthy = blame(event("node_failed")), blame(event("node_unhealthy", xid=[48]))
    exclusion = blame(
        event("node_excluded", attempt=1, details={"cause_class": "node", "node": NODE, "from_attempt": 0})
    )
    assert lost and unhealthy and exclusion
    assert lost.key == unhealthy.key == exclusion.key == "j:a0:failure"
    assert unhealthy.priority > lost.priority > exclusion.priority
    first, second = blame(event("straggler_detected", episode="e1")), blame(event("straggler_detected", episode="e2"))
    assert first and second and first.key != second.key
