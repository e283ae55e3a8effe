"""Where a rank's lines are gone (its pod deleted by a job restart, a node's files removed): the last lines of
each failed rank, as its `rank_failed` event stored them (ftplane/contract.py: at most TAIL_LINES)."""

from __future__ import annotations

from datetime import datetime

from api.services.logs.lines import LogLine, LogQuery, LogStream, LogTarget, page

NOTICE = (
    "attempt {attempt}'s {where} are gone: these are the last lines of each rank that failed, as stored with its "
    "rank_failed event"
)


def read(target: LogTarget, query: LogQuery, where: str) -> LogStream:
    lines = []
    for event in target.stored_tails:
        ts = event["ts"]
        at = ts if isinstance(ts, datetime) else datetime.fromisoformat(str(ts))
        for seq, text in enumerate(event["tail"].splitlines()):
            line = LogLine(at, event["rank"], seq, event.get("node"), query.attempt, event.get("cycle"), text)
            if query.wants(line):
                lines.append(line)
    lines.sort(key=lambda x: x.key)
    chosen, cursor = page(lines, query)
    return LogStream("events", chosen, cursor, notice=NOTICE.format(attempt=query.attempt, where=where))
