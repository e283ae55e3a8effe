"""What a log read is about and what it gives: the query, the job as a source needs it, the lines, the page.

Lines are ordered by (time, rank, seq): `seq` numbers a rank's lines where it was read (the node's kept
files number them; a pod's log, by position within the second). A page ends at a line; the cursor is
that line's key, and the next page is what comes after it.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

MAX_LIMIT = 10_000  # lines in one page (a larger `limit` is capped, and the answer says so)
DEFAULT_LIMIT = 1_000

Key = tuple[datetime, int, int]  # (ts, rank, seq)


@dataclass(frozen=True)
class LogLine:
    ts: datetime
    rank: int
    seq: int
    node: str | None
    attempt: int
    cycle: int | None
    line: str

    @property
    def key(self) -> Key:
        return (self.ts, self.rank, self.seq)

    def as_json(self) -> dict[str, Any]:
        return {
            "ts": self.ts.isoformat().replace("+00:00", "Z"),
            "rank": self.rank,
            "node": self.node,
            "attempt": self.attempt,
            "cycle": self.cycle,
            "line": self.line,
        }


@dataclass(frozen=True)
class LogQuery:
    """A read of one attempt's lines, already checked against the job (routes check its fields)."""

    attempt: int
    rank: int | None = None
    node: str | None = None
    cycle: int | None = None
    tail: int | None = None
    since: datetime | None = None
    after: Key | None = None  # from the cursor
    limit: int = DEFAULT_LIMIT
    follow: bool = False

    def wants(self, line: LogLine) -> bool:
        return (
            (self.rank is None or line.rank == self.rank)
            and (self.node is None or line.node == self.node)
            and (self.cycle is None or line.cycle == self.cycle)
            and (self.since is None or line.ts >= self.since)
            and (self.after is None or line.key > self.after)
        )


@dataclass(frozen=True)
class LogTarget:
    """The job as a log source needs it: read from the database before a read starts (none is held after)."""

    job_id: str
    backend: str
    current_attempt: int
    world_size: int
    nodes: int
    procs_per_node: int
    namespace: str | None = None
    # the attempt's failure tails stored in events (rank_failed), for a source whose lines are gone
    stored_tails: tuple[dict[str, Any], ...] = ()
    known_nodes: frozenset[str] = frozenset()  # nodes the control plane heard of in this attempt


Follow = Callable[[], AsyncGenerator[list[LogLine], None]]


@dataclass
class LogStream:
    """A read's answer: the page, and (following) the lines that come after it, in batches; an empty batch is a
    tick with nothing new (the reader sends keep-alives and checks its deadline on them)."""

    source: str  # node-files, pod-logs, events
    lines: list[LogLine]
    next_cursor: str | None = None
    follow: Follow | None = None
    notice: str | None = None
    nodes: list[str] = field(default_factory=list)  # the nodes the source found
    pods: list[str] = field(default_factory=list)  # the pods read (kubernetes)


class BadCursor(ValueError):
    pass


def encode_cursor(key: Key) -> str:
    text = json.dumps([key[0].isoformat(), key[1], key[2]], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Key:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        ts, rank, seq = json.loads(raw)
        at = datetime.fromisoformat(ts)
        if at.tzinfo is None or not isinstance(rank, int) or not isinstance(seq, int):
            raise ValueError
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError):
        raise BadCursor("not a cursor this server issued: pass the Ftplane-Next-Cursor of the previous page") from None
    return (at, rank, seq)


def page(lines: list[LogLine], query: LogQuery) -> tuple[list[LogLine], str | None]:
    """The lines a query's page holds (already filtered and in order): its tail, or its first `limit` lines and
    the cursor after them when more follow."""
    if query.tail is not None:
        return lines[-min(query.tail, query.limit) :] if query.tail else [], None
    if len(lines) > query.limit:
        kept = lines[: query.limit]
        return kept, encode_cursor(kept[-1].key)
    return lines, None
