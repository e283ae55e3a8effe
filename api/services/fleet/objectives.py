"""ETTR objectives: a project's jobs (those carrying a label selector) should reach a target ETTR over a rolling
window. Each is evaluated with the fleet's goodput (report.py), GPU-weighted:

    budget       (1 - target) x the window's wall GPU-hours: the GPU-hours the jobs may lose
    budget left  1 - lost / budget (below 0: overspent)
    burn rate    over the window's last 1/28 (6 h of 7 d): (1 - ETTR there) / (1 - target); 1 spends the budget
                 exactly over the window, the objective's `burn_rate` (10 by default) spends it in a tenth of it
    breached     the window's ETTR is below the target (below_target), or the burn rate is above the objective's
                 (burn_rate); a window without wall time is not breached

What a breach sends, and when: breaches.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from api.core.security import new_id
from api.database.tables import Objective, ObjectiveBreach
from api.schemas.events import utcnow
from api.schemas.fleet import ObjectiveIn, ObjectiveOut, ObjectiveStatus, Spender, seconds_of
from api.services.fleet.query import Scope
from api.services.fleet.report import fleet_goodput

BURN_SHARE = 1 / 28  # the part of the window the burn rate is measured over
TOP = 5


def create(session: Session, body: ObjectiveIn) -> Objective:
    row = Objective(
        id=new_id(),
        project=body.project,
        name=body.name,
        selector=dict(body.selector),
        target=body.target,
        window=body.window,
        burn_rate=body.burn_rate,
        created_at=utcnow(),
        last={},
    )
    session.add(row)
    session.flush()
    return row


def get(session: Session, objective_id: str) -> Objective | None:
    return session.get(Objective, objective_id)


def list_all(session: Session, projects: list[str] | None) -> list[Objective]:
    """Every objective (`projects` None), or those of these projects."""
    query = select(Objective).order_by(Objective.created_at, Objective.id)
    if projects is not None:
        query = query.where(Objective.project.in_(projects))
    return list(session.scalars(query))


def remove(session: Session, objective: Objective) -> None:
    session.execute(delete(ObjectiveBreach).where(ObjectiveBreach.objective_id == objective.id))
    session.delete(objective)
    session.flush()


def evaluate(session: Session, objective: Objective, now: datetime | None = None) -> ObjectiveStatus:
    """The objective now: the window's ETTR, its budget, the burn rate, whether it is breached, and who spent it."""
    now = now or utcnow()
    window = timedelta(seconds=seconds_of(objective.window))
    scope = Scope(projects=[objective.project], labels=dict(objective.selector or {}))
    found = fleet_goodput(session, since=now - window, until=now, now=now, scope=scope, top=TOP)
    whole, spenders = found.total, found.top_jobs
    recent = fleet_goodput(session, since=now - window * BURN_SHARE, until=now, now=now, scope=scope, top=0).total
    target = objective.target
    lost = sum(whole.lost_gpu_hours.values())
    budget = (1 - target) * whole.wall_gpu_hours
    burn = (1 - recent.ettr) / (1 - target) if recent.ettr is not None else None
    reason: Literal["below_target", "burn_rate"] | None = None
    if whole.ettr is not None and whole.ettr < target:
        reason = "below_target"
    elif burn is not None and burn > objective.burn_rate:
        reason = "burn_rate"
    causes = {cause: hours for cause, hours in whole.lost_gpu_hours.items() if hours > 0}
    return ObjectiveStatus(
        evaluated_at=now,
        ettr=whole.ettr,
        wall_gpu_hours=whole.wall_gpu_hours,
        lost_gpu_hours=lost,
        budget_gpu_hours=budget,
        budget_left=1 - lost / budget if budget > 0 else None,
        burn_rate=burn,
        breached=reason is not None,
        reason=reason,
        top_causes=dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        top_jobs=[
            Spender(job_id=j.job_id, name=j.name, lost_gpu_hours=j.lost_gpu_hours, lost_by_cause=j.lost_by_cause)
            for j in spenders
        ],
    )


def out(objective: Objective, status: ObjectiveStatus | None) -> ObjectiveOut:
    return ObjectiveOut(
        id=objective.id,
        project=objective.project,
        name=objective.name,
        selector={str(k): str(v) for k, v in (objective.selector or {}).items()},
        target=objective.target,
        window=objective.window,
        burn_rate=objective.burn_rate,
        created_at=objective.created_at,
        breached_since=objective.breached_since,
        status=status,
    )
