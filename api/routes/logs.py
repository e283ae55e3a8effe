"""`GET /v1/jobs/{id}/logs`: what each rank printed, as NDJSON or text, a page at a time or followed."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.core.config import get_settings
from api.core.errors import ApiError, responses
from api.core.openapi import CURSOR_PATTERN
from api.deps import JobViewerDep, SessionDep
from api.routes.jobs import load_job
from api.schemas.events import Instant
from api.schemas.logs import HEADERS, LINE_SCHEMA, NDJSON, TEXT
from api.services import logs
from api.services.logs.lines import LogLine, LogQuery, LogStream

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["logs"])

FOLLOW_UNTIL = "Ftplane-Follow-Until"  # a followed stream's end at the latest (FTPLANE_LOGS_FOLLOW_MAX_S from now)
FOLLOW_HEADERS = {
    **HEADERS,
    FOLLOW_UNTIL: {
        "description": "With follow=true: when the stream ends at the latest (ISO 8601, UTC). A stream that ends "
        "before it, ended because the ranks read had ended; one that ends then, at the deadline: follow again "
        "with `since` just after the last line for more.",
        "schema": {"type": "string", "format": "date-time"},
    },
}


@router.get(
    "/logs",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The lines, oldest first: NDJSON (one JSON object per line) or text, by `Accept`.",
            "content": {NDJSON: {"schema": LINE_SCHEMA}, TEXT: {"schema": {"type": "string"}}},
            "headers": FOLLOW_HEADERS,
        },
        **responses(404, 422),
    },
)
def get_logs(
    job_id: str,
    request: Request,
    session: SessionDep,
    _: JobViewerDep,
    attempt: int | None = Query(None, ge=0, le=10_000, description="Default: the job's newest attempt."),
    rank: int | None = Query(None, ge=0, le=1_000_000, description="One rank's lines (default: every rank's)."),
    node: str | None = Query(None, min_length=1, max_length=253, description="One node's ranks."),
    cycle: int | None = Query(
        None, ge=0, le=1_000_000, description="One launcher cycle (0: before any in-job restart)."
    ),
    tail: int | None = Query(None, ge=0, le=logs.MAX_LIMIT, description="The last N lines."),
    since: Instant | None = Query(None, description="Lines printed at or after this time."),
    cursor: str | None = Query(
        None, max_length=512, pattern=CURSOR_PATTERN, description="The Ftplane-Next-Cursor of the previous page."
    ),
    limit: Annotated[
        int | None, Query(ge=1, description="Lines per page (default 1,000; more than 10,000 is capped.")
    ] = None,
    follow: bool = Query(False, description="Then stream new lines until the ranks end or the deadline passes."),
) -> StreamingResponse:
    """What each rank of one attempt printed (stdout and stderr as the launcher tees them, redacted on the node),
    from the node agents' files (local backend) or the pods' logs (kubernetes); where those are gone, the
    failure tails stored with `rank_failed` events, said so in `Ftplane-Logs-Notice`.

    A page holds at most `limit` lines; `Ftplane-Next-Cursor` leads to the next. `tail` gives the last lines
    instead. `follow=true` gives the last `tail` (default `limit`) lines, then new ones as they are printed,
    until every rank read has ended or FTPLANE_LOGS_FOLLOW_MAX_S passes (`Ftplane-Follow-Until` says when: the
    stream then simply ends, with no closing line); a silent stream sends a blank line as a keep-alive every
    FTPLANE_LOGS_KEEPALIVE_S. Rules beyond the schema (422 naming the field): the attempt, rank and node must be
    the job's; a cursor is one this server issued, and pages without `tail` and `follow`.
    """
    job = load_job(session, job_id)
    target = logs.target_of(session, job, job.attempt if attempt is None else attempt)
    session.close()  # nothing below holds a database connection, however long it follows
    try:
        query, capped = logs.check(
            target,
            attempt=attempt,
            rank=rank,
            node=node,
            cycle=cycle,
            tail=tail,
            since=since,
            cursor=cursor,
            limit=limit,
            follow=follow,
        )
        stream = logs.open_logs(target, query)
    except logs.BadLogQuery as exc:
        raise ApiError(422, str(exc), field=exc.field) from None
    media = TEXT if _wants_text(request.headers.get("accept", "")) else NDJSON
    headers = {"Ftplane-Logs-Source": stream.source, "Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    if stream.next_cursor:
        headers["Ftplane-Next-Cursor"] = stream.next_cursor
    if capped:
        headers["Ftplane-Limit-Capped"] = str(logs.MAX_LIMIT)
    if stream.notice:
        headers["Ftplane-Logs-Notice"] = _header_text(stream.notice)
    link = logs.external_link(target, query, stream.pods[0] if len(stream.pods) == 1 else "")
    if link:
        headers["Link"] = f'<{link}>; rel="external"'
    deadline = time.monotonic() + get_settings().logs_follow_max_s
    if stream.follow is not None:
        until = datetime.now(UTC) + timedelta(seconds=get_settings().logs_follow_max_s)
        headers[FOLLOW_UNTIL] = until.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return StreamingResponse(_body(stream, query, media, deadline), media_type=media, headers=headers)


def _header_text(text: str) -> str:
    """One line of printable ASCII (what a header may carry)."""
    return "".join(c if " " <= c <= "~" else " " for c in text)[:1000]


def _wants_text(accept: str) -> bool:
    kinds = [part.split(";")[0].strip().lower() for part in accept.split(",")]
    return TEXT in kinds and NDJSON not in kinds and "application/json" not in kinds


def _render(lines: list[LogLine], query: LogQuery, media: str) -> bytes:
    if media == NDJSON:
        return "".join(json.dumps(line.as_json(), ensure_ascii=False) + "\n" for line in lines).encode()
    if query.rank is not None:
        return "".join(line.line + "\n" for line in lines).encode()
    return "".join(f"[rank{line.rank}] {line.line}\n" for line in lines).encode()


async def _body(stream: LogStream, query: LogQuery, media: str, deadline: float) -> AsyncIterator[bytes]:
    """The page, then (following) new lines until the source ends or the monotonic `deadline` passes."""
    if stream.lines or stream.follow is None:
        yield _render(stream.lines, query, media)
    if stream.follow is None:
        return
    settings = get_settings()
    quiet_since = time.monotonic()
    async with contextlib.aclosing(stream.follow()) as batches:
        async for batch in batches:
            now = time.monotonic()
            if batch:
                yield _render(batch, query, media)
                quiet_since = now
            elif now - quiet_since >= settings.logs_keepalive_s:
                yield b"\n"  # a keep-alive: a blank line is no line
                quiet_since = now
            if now >= deadline:
                return
