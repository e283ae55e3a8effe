"""The entry point of a node agent's report: stored fast (liveness only), grouped (group commit) or alone (the
fallback), or shed past this process's bounds (503 with Retry-After)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool

from api.core.config import get_settings
from api.core.errors import ApiError
from api.schemas.reports import NodeReport, ReportResult
from api.services import notifications
from api.services.ingest import admission, caches, group_commit, liveness_writer, rules

GROUPED_LIMIT = 4 * group_commit.MAX_REPORTS  # reports waiting for a group commit per process, past that shed


@dataclass(frozen=True, slots=True)
class LivenessOnly:
    """The fast path's outcome: nothing stored in a transaction, the report's liveness taken (`accepted`
    heartbeats)."""

    accepted: int


async def ingest(job_id: str, report: NodeReport) -> ReportResult | LivenessOnly:
    """Store a report: what must be stored before the reply (events, a new attempt or total, the faults to hand
    over) in a transaction, its liveness in the coalescing writer. Raises the ApiError of a missing job (404), an
    ended one (409), a database that is away or a report shed (503)."""
    state = await caches.job_state(job_id)
    if state is None:
        raise ApiError(404, f"no job with id {job_id!r}", field="job_id")
    refused = rules.refusal_if_ended(state.status, report)
    if refused is not None:
        raise refused
    writer = liveness_writer.writer()
    if not writer.healthy:
        raise ApiError(503, "the database is unavailable; retry shortly", headers={"Retry-After": "1"})
    ranks = {r.rank for r in report.agent.ranks} | {b.rank for b in report.heartbeats}
    new_total = rules.has_new_total(report, state.total_steps)
    if not (report.events or report.attempt > state.attempt or state.fault_ranks & ranks or new_total):
        return LivenessOnly(await _take_liveness(writer, job_id, report, state.attempt))
    exclusive = bool(
        report.attempt > state.attempt
        or state.fault_ranks & ranks
        or rules.changes_job(state.status, state.total_steps, report)
    )
    # faults of a new attempt are not in the cached state; else a fault asked for meanwhile waits for the next
    # report, as it does on the fast path (caches.JOB_STATE_TTL_S)
    look_for_faults = bool(state.fault_ranks & ranks) or report.attempt != state.attempt
    # stored with other nodes' reports in one transaction; alone where the batch could not take it
    outcome = await _admitted(
        "grouped", GROUPED_LIMIT, writer, job_id, report, state.attempt, _store_grouped, look_for_faults, exclusive
    )
    if outcome is None:
        outcome = await _admitted(
            "alone", get_settings().db_pool_size, writer, job_id, report, state.attempt, _store_alone, look_for_faults
        )
    assert outcome is not None  # stored alone: a result or an error
    result, attempt = outcome
    result.accepted = await _take_liveness(writer, job_id, report, attempt)
    return result


async def _admitted(
    kind: str,
    limit: int,
    writer: liveness_writer.LivenessWriter,
    job_id: str,
    report: NodeReport,
    attempt: int,
    store: Callable[..., Awaitable[group_commit.Outcome]],
    *args: Any,
) -> group_commit.Outcome:
    """`store(job_id, report, *args)` in one of the process's slots of `kind`; with none free the report is shed: its
    liveness taken now, 503 with Retry-After, its events sent again by the agent (admission.py). The 503 says
    whether the liveness was taken (`liveness_taken`, and `accepted` heartbeats), so that the agent resends only
    the events."""
    slots = admission.slots(kind, limit)
    if not slots.take():
        accepted = await _take_liveness(writer, job_id, report, attempt)
        raise ApiError(
            503,
            f"{slots.limit} reports with events are being stored by this server; resend the events after Retry-After",
            headers={"Retry-After": str(slots.retry_after(report.agent.interval_s))},
            details={"liveness_taken": rules.takes_liveness(report, attempt), "accepted": accepted},
        )
    try:
        return await store(job_id, report, *args)
    finally:
        slots.give_back()


async def _store_grouped(
    job_id: str, report: NodeReport, look_for_faults: bool, exclusive: bool
) -> group_commit.Outcome:
    answer = group_commit.group_commit().submit(job_id, report, look_for_faults=look_for_faults, exclusive=exclusive)
    return await asyncio.wrap_future(answer)


async def _store_alone(job_id: str, report: NodeReport, look_for_faults: bool) -> tuple[ReportResult, int]:
    """In a transaction of its own, under the exclusive lock (it is the fallback: its view may be stale)."""
    return await run_in_threadpool(group_commit.store_alone, job_id, report, look_for_faults=look_for_faults)


async def _take_liveness(writer: liveness_writer.LivenessWriter, job_id: str, report: NodeReport, attempt: int) -> int:
    """The report's liveness and heartbeats into the coalescing writer (soft state), where `rules.takes_liveness`."""
    if not rules.takes_liveness(report, attempt):
        return 0
    if writer.period_s <= 0:  # written at once (no coalescing): a database write, off the event loop
        accepted = await run_in_threadpool(writer.add, job_id, report)
    else:
        accepted = writer.add(job_id, report)
    notifications.heartbeats_ingested(accepted)
    return accepted
