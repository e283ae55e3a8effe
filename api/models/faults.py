"""The fault outbox: every requested fault is a row until whoever injects it has it.

A fault has one `delivery`, decided once when it is requested (`delivery_for`):
- `agent`: the node agent of the rank's node carries it out now, from outside the rank's code (a
  signal to the rank's process, the node's loss); it rides on the reply to that agent's next
  report, and is marked delivered as it is handed over: at most once, since injecting it twice is
  worse than not at all;
- `trainer`: the rank itself injects it (an exception, or any fault at a given step); it rides on
  every reply to the agent (which forwards it to the rank) and on heartbeat replies, until the rank
  reports it injected (`mark_fired`), so a rank restarted before the step still gets it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from api.core.security import new_id
from api.database.tables import Job, PendingFault
from api.schemas.events import utcnow

# What only the rank's own code can do: raise inside the training step, sleep in each step (a slowdown).
RANK_ONLY_KINDS = frozenset({"exception", "slowdown"})


class Delivery(StrEnum):
    agent = "agent"
    trainer = "trainer"


def delivery_for(kind: str, *, now: bool) -> Delivery:
    """Who injects a fault of `kind`, asked for now or at a step: the one place this rule is written."""
    if now and kind not in RANK_ONLY_KINDS:
        return Delivery.agent
    return Delivery.trainer


def request(
    session: Session,
    job_id: str,
    attempt: int,
    *,
    kind: str,
    rank: int,
    at_step: int | None,
    now: bool,
    fraction: float | None = None,
    duration_steps: int | None = None,
) -> PendingFault:
    delivery = delivery_for(kind, now=now)
    fault = PendingFault(
        id=new_id(),
        job_id=job_id,
        attempt=attempt,
        kind=kind,
        rank=rank,
        at_step=None if delivery == Delivery.agent else at_step,
        fraction=fraction,
        duration_steps=duration_steps,
        delivery=delivery.value,
    )
    session.add(fault)
    return fault


def undelivered(
    session: Session,
    job_id: str,
    attempt: int,
    delivery: Delivery | Collection[Delivery],
    *,
    ranks: Collection[int] | None = None,
) -> list[PendingFault]:
    """The attempt's faults not yet handed over by `delivery` (one, or several: the agent's first)."""
    deliveries = [delivery] if isinstance(delivery, Delivery) else list(delivery)
    query = select(PendingFault).where(
        PendingFault.job_id == job_id,
        PendingFault.attempt == attempt,
        PendingFault.delivery.in_([d.value for d in deliveries]),
        PendingFault.delivered_at.is_(None),
    )
    if ranks is not None:
        query = query.where(PendingFault.rank.in_(list(ranks)))
    return sorted(session.scalars(query), key=lambda f: f.delivery != Delivery.agent)


def jobs_with_undelivered(session: Session, delivery: Delivery, job_statuses: Collection[str]) -> list[str]:
    """Jobs in one of `job_statuses` with a fault for their current attempt still waiting for `delivery`."""
    query = (
        select(PendingFault.job_id)
        .join(Job, Job.id == PendingFault.job_id)
        .where(
            PendingFault.delivery == delivery.value,
            PendingFault.delivered_at.is_(None),
            PendingFault.attempt == Job.attempt,
            Job.status.in_(list(job_statuses)),
        )
        .distinct()
    )
    return list(session.scalars(query))


def mark_delivered(faults: Sequence[PendingFault], at: datetime | None = None) -> None:
    when = at or utcnow()
    for fault in faults:
        fault.delivered_at = when


def mark_fired(session: Session, job_id: str, fault_id: str) -> None:
    """The trainer reported the fault injected: it is never handed out again."""
    session.execute(
        update(PendingFault)
        .where(PendingFault.job_id == job_id, PendingFault.id == fault_id, PendingFault.delivered_at.is_(None))
        .values(delivered_at=utcnow())
    )
