"""A job's logs: what each rank printed, per attempt, from wherever the lines are.

    local backend   node_files.py    the node agents' kept files, on this machine
    kubernetes      pods.py          the trainer containers' logs, through the API server
    lines gone      stored_tails.py  each failed rank's last lines, stored with its rank_failed

`target_of` reads what a read needs from the database (the job, the attempt's failure tails and
node names) while the caller's session is open; `check` refuses a query that names what the job
does not have; `open_logs` then reads, with no database session held, however long it follows.
`FTPLANE_LOGS_URL_TEMPLATE`, where set, links each answer to the cluster's own log store.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sqlalchemy.orm import Session

from api import models
from api.core.config import get_settings
from api.database.tables import Job
from api.schemas.events import EventType
from api.services import lifecycle
from api.services.logs import stored_tails
from api.services.logs.lines import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    BadCursor,
    LogLine,
    LogQuery,
    LogStream,
    LogTarget,
    decode_cursor,
)

__all__ = ["MAX_LIMIT", "BadLogQuery", "LogLine", "LogQuery", "LogStream", "check", "open_logs", "target_of"]


class BadLogQuery(ValueError):
    """A query naming what the job does not have; `field` names the parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def target_of(session: Session, job: Job, attempt: int) -> LogTarget:
    spec = lifecycle.spec_of(job)
    failed = [
        e
        for e in models.events.of_job(session, job.id, types=[EventType.rank_failed.value])
        if e.attempt == attempt and e.rank is not None and isinstance((e.details or {}).get("tail"), str)
    ]
    tails = tuple(
        {"ts": e.ts, "rank": e.rank, "node": e.node, "tail": e.details["tail"], "cycle": e.details.get("round")}
        for e in failed
    )
    known = {n.node for n in models.nodes.of_job(session, job.id) if n.attempt == attempt}
    known |= {e.node for e in failed if e.node}
    return LogTarget(
        job_id=job.id,
        backend=job.backend,
        current_attempt=job.attempt,
        world_size=spec.world_size,
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        namespace=spec.namespace,
        stored_tails=tails,
        known_nodes=frozenset(known),
    )


def check(
    target: LogTarget,
    *,
    attempt: int | None,
    rank: int | None,
    node: str | None,
    cycle: int | None,
    tail: int | None,
    since: datetime | None,
    cursor: str | None,
    limit: int | None,
    follow: bool,
) -> tuple[LogQuery, bool]:
    """The query, checked against the job; and whether `limit` was capped at MAX_LIMIT."""
    number = target.current_attempt if attempt is None else attempt
    if number > target.current_attempt:
        raise BadLogQuery("attempt", f"the job has attempts 0 to {target.current_attempt}, not {number}")
    if rank is not None and rank >= target.world_size:
        raise BadLogQuery(
            "rank", f"rank {rank} is outside the job's {target.world_size} ranks (0 to {target.world_size - 1})"
        )
    if cursor is not None and (tail is not None or follow):
        raise BadLogQuery("cursor", "a cursor pages forward: give it without tail and follow")
    try:
        after = decode_cursor(cursor) if cursor is not None else None
    except BadCursor as exc:
        raise BadLogQuery("cursor", str(exc)) from None
    wanted = DEFAULT_LIMIT if limit is None else limit
    query = LogQuery(number, rank, node, cycle, tail, since, after, min(wanted, MAX_LIMIT), follow)
    return query, wanted > MAX_LIMIT


def open_logs(target: LogTarget, query: LogQuery) -> LogStream:
    """Read the page (and, following, prepare what comes after it) from the attempt's source."""
    stream: LogStream | None
    if target.backend == "kubernetes":
        from api.services.logs.pods import KubernetesLogsError, PodLogs

        try:
            source = PodLogs(target, query)
            _check_node(query, target, {p.node for p in source.pods if p.node})
            stream, where = source.read(), "pods"
        except KubernetesLogsError as exc:  # the cluster cannot be read now: what the control plane stored
            _check_node(query, target, set())
            unread = stored_tails.read(target, replace(query, follow=False), "pods")
            unread.notice = f"{exc}; these are the last lines of each rank that failed, stored with its rank_failed"
            return unread
    else:
        from api.services.logs.node_files import NodeFiles

        files = NodeFiles(get_settings().resolved_runs_dir, target, query)
        _check_node(query, target, {n.name for n in files.nodes})
        stream, where = files.read(), "nodes' files"
    if stream is None:
        stream = stored_tails.read(target, replace(query, follow=False), where)
    return stream


def _check_node(query: LogQuery, target: LogTarget, found: set[str]) -> None:
    known = found | target.known_nodes
    if query.node is not None and query.node not in known:
        listed = ", ".join(sorted(known)) or "none yet"
        raise BadLogQuery("node", f"node {query.node!r} is not one of attempt {query.attempt}'s nodes ({listed})")


def external_link(target: LogTarget, query: LogQuery, pod: str = "") -> str | None:
    """FTPLANE_LOGS_URL_TEMPLATE filled in for this read ({job}, {attempt}, {namespace}, {node}, {rank}, {pod})."""
    template = get_settings().logs_url_template
    if not template:
        return None
    values = {
        "job": target.job_id,
        "attempt": query.attempt,
        "namespace": target.namespace or "",
        "node": query.node or "",
        "rank": "" if query.rank is None else query.rank,
        "pod": pod,
    }
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return template
