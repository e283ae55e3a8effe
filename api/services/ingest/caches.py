"""What the node-report path must know about every report, from short-lived in-process caches.

A 2,048-node job sends hundreds of reports a second; asking the database each time who the token
is and what state the job is in would cost more than the report itself. So:

- a token's principal is kept `FTPLANE_AUTH_CACHE_TTL_S` (5 s by default): a token revoked in the
  database (or a role binding removed, for a JWT) stops working on the report route within that long
  (every other route asks each time); a JWT's is never kept past its expiry;
- a job's status, attempt, total steps and the ranks with undelivered faults are kept for
  JOB_STATE_TTL_S: a job that ended takes reports that carry no events for at most that long
  more, and a new fault reaches its node's agent at most that long later.

A cache miss loads once per process at a time: the requests that miss together (each second, hundreds)
wait for that one load instead of each running its own.

Anything a report changes besides liveness (events, a new attempt, a fault to hand over, the
total steps) goes through the database in a transaction of its own, which then forgets the
job's cached state.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from cachetools import TTLCache
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from api.core.authz import Principal
from api.core.config import get_settings
from api.core.db import session_scope
from api.core.security import digest
from api.database.tables import Job, PendingFault
from api.schemas.events import utcnow
from api.services import authentication, lifecycle

T = TypeVar("T")

JOB_STATE_TTL_S = 1.0
MAX_CACHED = 10_000


@dataclass(frozen=True)
class JobState:
    status: str
    attempt: int
    total_steps: int | None
    fault_ranks: frozenset[int]  # ranks of the current attempt with a fault not yet delivered
    project: str = "default"
    report_interval_s: float = 1.0  # how often each of its nodes reports


_lock = threading.Lock()
# One read per lookup: `key in cache` then `cache[key]` read the clock twice, and an entry that expired between
# them raised KeyError (a 500 on the report route, seen at 16,384 nodes).
_MISSING: Any = object()
_principals: TTLCache[str, Principal | None] = TTLCache(MAX_CACHED, ttl=5.0)
_jobs: TTLCache[str, JobState | None] = TTLCache(MAX_CACHED, ttl=JOB_STATE_TTL_S)


def cached_principal(token: str) -> tuple[bool, Principal | None]:
    """(found in the cache, principal): a cached None is a token known to be invalid."""
    ttl = get_settings().auth_cache_ttl_s
    if ttl <= 0:
        return False, None
    key = digest(token)
    with _lock:
        _resize_principals(ttl)
        held = _principals.get(key, _MISSING)
        if held is _MISSING:
            return False, None
        if held is not None and held.expires_at is not None and held.expires_at <= utcnow():
            _principals.pop(key, None)  # an expired JWT is checked again (and refused)
            return False, None
        return True, held


def load_principal(token: str) -> Principal | None:
    """The token's principal as every route authenticates it (a token, or an OIDC JWT), kept for the cache's TTL."""
    with session_scope() as session:
        try:
            principal: Principal | None = authentication.authenticate(session, token)
        except authentication.Unauthenticated:
            principal = None
    if get_settings().auth_cache_ttl_s > 0:
        with _lock:
            _principals[digest(token)] = principal
    return principal


def cached_job(job_id: str) -> tuple[bool, JobState | None]:
    with _lock:
        state = _jobs.get(job_id, _MISSING)
    return (False, None) if state is _MISSING else (True, state)


def load_job(job_id: str) -> JobState | None:
    with session_scope() as session:
        job = session.get(Job, job_id)
        state = None
        if job is not None:
            ranks = session.scalars(
                select(PendingFault.rank).where(
                    PendingFault.job_id == job_id,
                    PendingFault.attempt == job.attempt,
                    PendingFault.delivered_at.is_(None),
                )
            )
            interval = lifecycle.spec_of(job).report_interval_s
            state = JobState(job.status, job.attempt, job.total_steps, frozenset(ranks), job.project, interval)
    with _lock:
        _jobs[job_id] = state
    return state


async def job_state(job_id: str) -> JobState | None:
    """The job's state, from the cache or loaded (once for all the requests that miss it together)."""
    found, state = cached_job(job_id)
    if found:
        return state
    return await _load_once(f"job:{job_id}", load_job, job_id)


async def principal(token: str) -> Principal | None:
    """The token's principal, from the cache or loaded (once for all the requests that miss it together)."""
    found, held = cached_principal(token)
    if found:
        return held
    return await _load_once(f"token:{digest(token)}", load_principal, token)


_in_flight: dict[tuple[int, str], asyncio.Future[Any]] = {}


async def _load_once(key: str, load: Callable[[str], T], argument: str) -> T:
    slot = (id(asyncio.get_running_loop()), key)  # futures belong to their loop (a test's client runs loops of its own)
    pending = _in_flight.get(slot)
    if pending is None:
        pending = asyncio.ensure_future(run_in_threadpool(load, argument))
        _in_flight[slot] = pending
        pending.add_done_callback(lambda _: _in_flight.pop(slot, None))
    return cast(T, await asyncio.shield(pending))


def forget_job(job_id: str) -> None:
    with _lock:
        _jobs.pop(job_id, None)


def forget_all() -> None:
    """Tests switch databases between cases."""
    with _lock:
        _principals.clear()
        _jobs.clear()


def _resize_principals(ttl: float) -> None:
    global _principals
    if _principals.ttl != ttl:
        _principals = TTLCache(MAX_CACHED, ttl=ttl)
