"""The shapes of `GET /v1/jobs/{id}/logs`: a line as NDJSON carries it, and the headers that go with a page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

NDJSON = "application/x-ndjson"
TEXT = "text/plain"


class LogLineOut(BaseModel):
    """One line a rank printed (one JSON object per line of the NDJSON body)."""

    ts: datetime = Field(description="When the node saw it (the agent's clock; the kubelet's for pod logs).")
    rank: int = Field(description="The global rank that printed it.")
    node: str | None = Field(description="The node it ran on.")
    attempt: int
    cycle: int | None = Field(
        description="The launcher's cycle (0 until the first in-job restart); null where a pod's log does not say it."
    )
    line: str = Field(description="The line, without its newline; secrets and tokens redacted on the node.")


LINE_SCHEMA: dict[str, Any] = LogLineOut.model_json_schema()


def _header(description: str) -> dict[str, Any]:
    return {"description": description, "schema": {"type": "string"}}


HEADERS: dict[str, Any] = {
    "Ftplane-Logs-Source": _header("Where the lines come from: node-files, pod-logs, or events (failure tails)."),
    "Ftplane-Next-Cursor": _header("Pass as `cursor` for the next page; absent on the last page."),
    "Ftplane-Limit-Capped": _header("Present when `limit` was more than this many lines: the page holds at most it."),
    "Ftplane-Logs-Notice": _header("Why the lines are not the ranks' own (their pods or files are gone)."),
    "Link": _header('FTPLANE_LOGS_URL_TEMPLATE filled in: `<url>; rel="external"`, the cluster\'s own log store.'),
}
