"""An objective's breaches: found by its evaluation (objectives.py), announced once each.

    fine --breached--> breached      a breach row, and one `objective_breached` webhook
    breached --breached--> breached  nothing (the breach goes on; its row keeps the first evaluation)
    breached --fine--> fine          the breach row is closed (recovered_at)

So a breach sends once, not on every pass, and a recovery then a new breach sends again. The webhook goes through
the outbox like every other (signed, retried, in the delivery log): written in the evaluation's transaction,
enqueued after it commits, to the objective's project's subscriptions that ask for `objective_breached` and whose
label selector the objective's selector carries. Its body:

    {"type": "objective_breached", "timestamp": "<when found>",
     "data": {"objective": {id, project, name, selector, target, window, burn_rate},
              "breach": {id, reason: below_target | burn_rate, started_at},
              "status": {ettr, budget_left, burn_rate, wall_gpu_hours, lost_gpu_hours, budget_gpu_hours},
              "causes": {cause: GPU-hours lost}, "jobs": [{id, name, lost_gpu_hours, lost_by_cause, url}]}}
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.core.config import get_settings
from api.core.security import new_id
from api.database.tables import Objective, ObjectiveBreach
from api.schemas.events import EventType, utcnow
from api.schemas.fleet import ObjectiveStatus
from api.services import notifications
from api.services.fleet import objectives
from api.webhooks import outbox


def check(session: Session, objective: Objective, now: datetime | None = None) -> ObjectiveStatus:
    """Evaluate the objective and move its breach state; the caller commits (then the webhook is enqueued)."""
    now = now or utcnow()
    status = objectives.evaluate(session, objective, now)
    objective.evaluated_at = now
    objective.last = status.model_dump(mode="json")
    if status.breached and objective.breached_since is None:
        objective.breached_since = now
        breach = ObjectiveBreach(
            id=new_id(),
            objective_id=objective.id,
            started_at=now,
            reason=status.reason or "below_target",
            details=status.model_dump(mode="json"),
        )
        session.add(breach)
        _announce(session, objective, breach, status)
    elif not status.breached and objective.breached_since is not None:
        objective.breached_since = None
        open_breach = session.scalar(
            select(ObjectiveBreach).where(
                ObjectiveBreach.objective_id == objective.id, ObjectiveBreach.recovered_at.is_(None)
            )
        )
        if open_breach is not None:
            open_breach.recovered_at = now
    return status


def _announce(session: Session, objective: Objective, breach: ObjectiveBreach, status: ObjectiveStatus) -> None:
    payload = message(objective, breach, status, get_settings().resolved_public_url)
    labels = {str(k): str(v) for k, v in (objective.selector or {}).items()}
    kind = EventType.objective_breached.value
    ids = outbox.record_message(session, objective.project, kind, labels, payload, utcnow())  # due now, whatever `now`
    if ids:
        notifications.after_commit(session, lambda: outbox.enqueue_all(ids))


def message(objective: Objective, breach: ObjectiveBreach, status: ObjectiveStatus, public_url: str) -> dict[str, Any]:
    base = public_url.rstrip("/")
    return {
        "type": EventType.objective_breached.value,
        "timestamp": _iso(breach.started_at),
        "data": {
            "objective": {
                "id": objective.id,
                "project": objective.project,
                "name": objective.name,
                "selector": dict(objective.selector or {}),
                "target": objective.target,
                "window": objective.window,
                "burn_rate": objective.burn_rate,
            },
            "breach": {"id": breach.id, "reason": breach.reason, "started_at": _iso(breach.started_at)},
            "status": {
                "ettr": status.ettr,
                "budget_left": status.budget_left,
                "burn_rate": status.burn_rate,
                "wall_gpu_hours": status.wall_gpu_hours,
                "lost_gpu_hours": status.lost_gpu_hours,
                "budget_gpu_hours": status.budget_gpu_hours,
            },
            "causes": status.top_causes,
            "jobs": [
                {
                    "id": j.job_id,
                    "name": j.name,
                    "lost_gpu_hours": j.lost_gpu_hours,
                    "lost_by_cause": j.lost_by_cause,
                    "url": f"{base}/jobs/{j.job_id}",
                }
                for j in status.top_jobs
            ],
        },
    }


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")
