"""Which jobs the summarize duty recomputes, and the mark that keeps that cheap.

Events are append-only and their ids rise as they are inserted, though not always in the order their transactions
commit. The mark (one row) holds `settled_id`: every event up to it has been seen by a pass that summarized its job
afterwards. A pass reads the events past `settled_id` (a range of the primary key: the events of the last minute
or so, whatever the table holds), keeps the jobs whose newest event is newer than their summary, adds the jobs
never summarized and the running jobs due for a refresh, and, once it has summarized every changed job, moves
`settled_id` to the newest id it saw at least FTPLANE_GOODPUT_SETTLE_S before: by then every event up to that id
has committed. The event path itself writes nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.database.tables import Event, GoodputMark, GoodputSummary, Job
from api.models.upsert import insert_for

MARK = "summaries"
CHUNK = 500


@dataclass(frozen=True)
class Pick:
    jobs: list[str]  # changed first, then never summarized, then running and due for a refresh
    complete: bool  # every changed job is among `jobs`
    top: int  # the newest event id when the pass began


def pick(session: Session, now: datetime, *, limit: int, refresh_s: float) -> Pick:
    top = session.scalar(select(func.max(Event.id))) or 0
    mark = _mark(session, now, top)
    newest = dict(
        session.execute(
            select(Event.job_id, func.max(Event.id)).where(Event.id > mark.settled_id).group_by(Event.job_id)
        ).all()
    )
    ids = list(newest)
    summarized: dict[str, int] = {}
    for start in range(0, len(ids), CHUNK):
        summarized.update(
            session.execute(
                select(GoodputSummary.job_id, GoodputSummary.last_event_id).where(
                    GoodputSummary.job_id.in_(ids[start : start + CHUNK])
                )
            ).all()
        )
    changed = [job_id for job_id, newest_id in newest.items() if summarized.get(job_id, -1) < newest_id]
    never = session.scalars(
        select(Job.id)
        .outerjoin(GoodputSummary, GoodputSummary.job_id == Job.id)
        .where(GoodputSummary.job_id.is_(None))
        .order_by(Job.created_at)
        .limit(limit)
    ).all()
    stale = session.scalars(
        select(GoodputSummary.job_id)
        .where(
            GoodputSummary.open_bucket.is_not(None),
            GoodputSummary.computed_at <= now - timedelta(seconds=refresh_s),
        )
        .order_by(GoodputSummary.computed_at)
        .limit(limit)
    ).all()
    jobs = list(dict.fromkeys([*changed, *never, *stale]))[:limit]
    return Pick(jobs=jobs, complete=len(changed) <= limit, top=top)


def advance(session: Session, done: Pick, now: datetime, *, settle_s: float) -> None:
    """After a pass that summarized every job it picked: move the mark (the caller commits)."""
    if not done.complete:
        return
    mark = _mark(session, now, done.top)
    if now - mark.seen_at >= timedelta(seconds=settle_s):
        mark.settled_id = max(mark.settled_id, mark.seen_id)
        mark.seen_id = done.top
        mark.seen_at = now


def _mark(session: Session, now: datetime, top: int) -> GoodputMark:
    """The mark, locked; made on the first pass at the newest event (jobs summarized before are none: every job
    is then picked as never summarized)."""
    values = {"name": MARK, "settled_id": top, "seen_id": top, "seen_at": now}
    session.execute(insert_for(session, GoodputMark).values(**values).on_conflict_do_nothing())
    mark = session.scalar(
        select(GoodputMark).where(GoodputMark.name == MARK).with_for_update().execution_options(populate_existing=True)
    )
    assert mark is not None
    return mark
