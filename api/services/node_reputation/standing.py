"""A node's standing changed: the row, its history, and the events that tell people (a quarantine, a release).

How a node's events reach people: events are a job's, and webhooks go to the subscriptions of a job's project.
A quarantine is told once, on the job whose fault tipped the node (the newest fault that counts): a
`node_quarantined` event there (its details name every job and fault that counted), so each subscription of
that job's project that asks for the type gets one webhook per quarantine. Its end is told on the same job
(`node_released`), so whoever heard of the quarantine hears of its end. Everyone else reads the node's own
history (`GET /v1/nodes/{name}`, the dashboard's nodes page, `ftplane describe node`), and the jobs that run
later see the quarantined nodes named in their `submitted` event where the backend cannot avoid them.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from api import models
from api.database.tables import FleetNode
from api.models import fleet_nodes
from api.schemas.causes import CauseClass
from api.schemas.events import EventIn, EventType
from api.schemas.fleet_nodes import FaultKind, NodeState
from api.services.ingest import reporting
from api.services.node_reputation.rule import Fault, Judgement, Rule, Standing, describe, judge

RULE_ACTOR = "ftplane"
FAULTS_TOLD = 20  # of the faults that counted, at most this many are listed in node_quarantined
MAX_NAME_IN_KEY = 150  # a longer node name is hashed in its events' keys (at most 200 characters)


def judge_node(session: Session, name: str, now: datetime, rule: Rule) -> Judgement | None:
    """Judge the node by the rule at `now` and carry out what changes (under its row's lock)."""
    node = fleet_nodes.get(session, name, for_update=True)
    if node is None:
        return None
    rows = fleet_nodes.faults_since(session, name, now - rule.window)
    faults = [Fault(f.job_id, FaultKind(f.kind), f.ts, f.attempt) for f in rows]
    standing = Standing(
        NodeState(node.state), node.state_since, node.quarantined_until, node.forgiven_before, node.reason
    )
    judgement = judge(standing, faults, now, rule)
    for change in judgement.changes:
        if change == "released":
            _released(session, node, judgement.standing.reason or "its quarantine ended", RULE_ACTOR, now)
        elif change == "quarantined":
            _quarantined(session, node, judgement, rule, now)
        else:
            reason = judgement.standing.reason
            fleet_nodes.add_history(session, name, ts=now, state=change, action=change, reason=reason, actor=RULE_ACTOR)
    new = judgement.standing
    node.state = new.state.value
    node.state_since = new.since or now
    node.quarantined_until = new.quarantined_until
    node.forgiven_before = new.forgiven_before
    node.reason = new.reason
    return judgement


def release(session: Session, name: str, reason: str, actor: str, now: datetime) -> FleetNode | None:
    """A cluster admin releases the node: whatever its state, every fault so far is forgiven and it is healthy;
    a quarantine's end is told where the quarantine was. None: no such node."""
    node = fleet_nodes.get(session, name, for_update=True)
    if node is None:
        return None
    _released(session, node, reason, actor, now)
    node.state = NodeState.healthy.value
    node.state_since = now
    node.quarantined_until = None
    node.forgiven_before = now
    node.reason = f"released by {actor}: {reason}"
    return node


def _quarantined(session: Session, node: FleetNode, judgement: Judgement, rule: Rule, now: datetime) -> None:
    node.quarantines += 1
    tipping = judgement.counted[-1]
    node.announced_job_id = tipping.job_id
    until = judgement.standing.quarantined_until
    reason = judgement.standing.reason
    jobs = sorted({f.job_id for f in judgement.counted})
    told = [
        {"job_id": f.job_id, "attempt": f.attempt, "kind": f.kind.value, "ts": f.ts.isoformat()}
        for f in judgement.counted[-FAULTS_TOLD:]
    ]
    details: dict[str, Any] = {
        "cause": f"node {node.name} quarantined until {until.isoformat() if until else '?'}: "
        f"{describe(judgement.counted, rule)}",
        "cause_class": CauseClass.node.value,
        "node": node.name,
        "quarantine": node.quarantines,
        "until": until.isoformat() if until else None,
        "jobs": jobs,
        "faults": told,
    }
    _tell(session, tipping.job_id, EventType.node_quarantined, node, details)
    fleet_nodes.add_history(
        session,
        node.name,
        ts=now,
        state=NodeState.quarantined.value,
        action="quarantined",
        reason=reason,
        actor=RULE_ACTOR,
        details={"quarantine": node.quarantines, "jobs": jobs, "told_on": tipping.job_id},
    )


def _released(session: Session, node: FleetNode, reason: str, actor: str, now: datetime) -> None:
    quarantined = node.state == NodeState.quarantined.value
    if quarantined and node.announced_job_id is not None:
        details = {
            "cause": f"node {node.name} released: {reason}",
            "cause_class": CauseClass.node.value,
            "node": node.name,
            "quarantine": node.quarantines,
            "reason": reason,
            "by": actor,
        }
        _tell(session, node.announced_job_id, EventType.node_released, node, details)
    fleet_nodes.add_history(
        session,
        node.name,
        ts=now,
        state=NodeState.healthy.value,
        action="released",
        reason=reason,
        actor=actor,
        details={"was": node.state, **({"quarantine": node.quarantines} if quarantined else {})},
    )


def _tell(session: Session, job_id: str, type_: EventType, node: FleetNode, details: dict[str, Any]) -> None:
    """Record the node's event on a job, once per quarantine (its webhooks go out once the transaction commits)."""
    job = models.jobs.get(session, job_id, for_share=True)
    if job is None:
        return
    name = node.name if len(node.name) <= MAX_NAME_IN_KEY else hashlib.sha256(node.name.encode()).hexdigest()[:32]
    key = f"{type_.value}:{name}:{node.quarantines}"
    reporting.record_events(session, job, [EventIn(key=key, type=type_, node=node.name, details=details)])
