"""What a webhook says: the JSON body (Standard Webhooks shape, or a Slack message) and its signature.

The standard body, stored with the delivery when the event is stored, so every retry of one
`webhook-id` carries the same content:

    {"type": "injob_restart", "timestamp": "<event time>",
     "data": {"event": {id, type, ts, attempt, rank, node, step, details},
              "job": {id, name, status, attempt, labels, url},
              "affected": {"events", "rank_count", "node_count", "ranks", "nodes", "truncated"}}}
                                                                  # PER_RANK_TYPES only

A rank's failure, and the restart or end it caused, carry the failed rank's last lines in
`details.tail` (redacted on its node); a Slack message shows the last of them.

Where the event has a `cause` (the sentence), `details` carry its `cause_class` next to it: one
of `api.schemas.causes.CauseClass`, the one the event states (`unknown` if it states none), so a
receiver can switch on it without reading the sentence.

A failure that is stored once per rank or node (`PER_RANK_TYPES`: a job-wide hang is one
`hang_detected` per node with silent ranks, each naming them in `details.ranks`) is announced once per
batch of such events stored together: `affected` counts the events, the ranks and the nodes, and lists
the ranks and nodes (at most `AFFECTED_LISTED` of each).

Headers: `webhook-id` (stable across retries), `webhook-timestamp` (this attempt, Unix
seconds) and `webhook-signature` (`v1,<base64 HMAC-SHA256>`), made with the `standardwebhooks`
library; receivers verify with it or any Standard Webhooks implementation.
"""

from __future__ import annotations

import base64
import json
import secrets
from datetime import datetime
from typing import Any

from standardwebhooks import Webhook

from api.database.tables import Event, Job
from api.schemas.causes import cause_class_of
from api.schemas.events import EventType, utcnow

SECRET_PREFIX = "whsec_"
USER_AGENT = "ftplane-webhooks/1"

DEFAULT_EVENT_TYPES: tuple[EventType, ...] = (
    EventType.inprocess_restart,
    EventType.injob_restart,
    EventType.job_restart,
    EventType.hang_detected,
    EventType.node_excluded,
    EventType.straggler_detected,
    EventType.straggler_cleared,
    EventType.restart_storm,
    EventType.progress_stalled,
    EventType.recovery_stuck,
    EventType.node_quarantined,
    EventType.node_released,
    EventType.succeeded,
    EventType.failed,
    EventType.cancelled,
)

PER_RANK_TYPES = frozenset({EventType.hang_detected.value})
AFFECTED_LISTED = 64
SLACK_TAIL_LINES = 12  # of a failure's tail in a Slack message (a section holds 3,000 characters)

_TITLES = {
    EventType.inprocess_restart: (":repeat:", "in-process restart"),
    EventType.injob_restart: (":arrows_counterclockwise:", "in-job restart"),
    EventType.job_restart: (":recycle:", "job restart"),
    EventType.hang_detected: (":hourglass:", "hang detected"),
    EventType.node_excluded: (":no_entry:", "node excluded"),
    EventType.straggler_detected: (":turtle:", "straggler detected"),
    EventType.straggler_cleared: (":white_check_mark:", "straggler cleared"),
    EventType.restart_storm: (":tornado:", "restart storm"),
    EventType.progress_stalled: (":warning:", "progress stalled"),
    EventType.recovery_stuck: (":warning:", "recovery stuck"),
    EventType.node_quarantined: (":construction:", "node quarantined"),
    EventType.node_released: (":white_check_mark:", "node released"),
    EventType.succeeded: (":white_check_mark:", "succeeded"),
    EventType.failed: (":x:", "failed"),
    EventType.cancelled: (":octagonal_sign:", "cancelled"),
}


def new_secret() -> str:
    """A Standard Webhooks signing secret: `whsec_` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def job_summary(job: Job, public_url: str | None = None) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "id": job.id,
        "name": job.name,
        "status": job.status,
        "attempt": job.attempt,
        "labels": dict(job.labels or {}),
    }
    if public_url:
        summary["url"] = f"{public_url.rstrip('/')}/jobs/{job.id}"
    return summary


def standard_payload(
    job: Job, event: Event, public_url: str | None = None, together: list[Event] | None = None
) -> dict[str, Any]:
    """The body announcing `event`; `together`: the per-rank events it announces with it (itself included)."""
    payload: dict[str, Any] = {
        "type": event.type,
        "timestamp": _iso(event.ts),
        "data": {
            "event": {
                "id": event.id,
                "type": event.type,
                "ts": _iso(event.ts),
                "attempt": event.attempt,
                "rank": event.rank,
                "node": event.node,
                "step": event.step,
                "details": _details(event),
            },
            "job": job_summary(job, public_url),
        },
    }
    if event.type in PER_RANK_TYPES:
        payload["data"]["affected"] = _affected(together or [event])
    return payload


def _details(event: Event) -> dict[str, Any]:
    details = dict(event.details or {})
    if details.get("cause"):
        details["cause_class"] = cause_class_of(details).value
    return details


def _affected(events: list[Event]) -> dict[str, Any]:
    ranks = sorted({rank for e in events for rank in _ranks_of(e)})
    nodes = sorted({e.node for e in events if e.node})
    return {
        "events": len(events),
        "rank_count": len(ranks),
        "node_count": len(nodes),
        "ranks": ranks[:AFFECTED_LISTED],
        "nodes": nodes[:AFFECTED_LISTED],
        "truncated": len(ranks) > AFFECTED_LISTED or len(nodes) > AFFECTED_LISTED,
    }


def _ranks_of(event: Event) -> list[int]:
    """A node's hang names every silent rank of the node (`details.ranks`); a rank's, its own."""
    listed = (event.details or {}).get("ranks")
    if isinstance(listed, list):
        return [r for r in listed if isinstance(r, int)]
    return [event.rank] if event.rank is not None else []


def _slack_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A Slack incoming-webhook message (`text` for notifications, `blocks` for the layout)."""
    if payload.get("type") == EventType.objective_breached:
        return _slack_objective(payload)
    event = payload["data"]["event"]
    job = payload["data"]["job"]
    try:
        emoji, title = _TITLES[EventType(event["type"])]
    except (KeyError, ValueError):
        emoji, title = ":information_source:", str(event["type"]).replace("_", " ")
    details = event.get("details") or {}
    cause = details.get("cause")
    name = _slack_escape(str(job["name"]))
    headline = f"{emoji} {name}: {title}"
    if cause:
        headline += f": {_slack_escape(str(cause))[:300]}"
    facts = [f"job `{job['id']}`", f"status *{job['status']}*", f"attempt {event['attempt']}"]
    if cause and details.get("cause_class"):
        facts.append(f"cause: {_slack_escape(str(details['cause_class']))}")
    for key in ("rank", "node", "step"):
        if event.get(key) is not None:
            facts.append(f"{key} {_slack_escape(str(event[key]))}")
    affected = payload["data"].get("affected") or {}
    if affected.get("rank_count", 1) > 1:
        also = f"{affected['rank_count']} ranks"
        if affected.get("node_count"):
            also += f" on {affected['node_count']} node(s)"
        headline += f" ({also})"
        facts.append(also)
    linked = f"<{job['url']}|{name}>" if job.get("url") else name
    section = f"*{linked}*: {title}"
    if cause:
        section += f"\n>{_slack_escape(str(cause))[:1000]}"
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": section}}]
    tail = details.get("tail")
    if isinstance(tail, str) and tail:  # the failed rank's last lines: the traceback's last frame and message
        shown = "\n".join(tail.splitlines()[-SLACK_TAIL_LINES:])[-2800:]
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{_slack_escape(shown)}```"}})
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)}]})
    return {"text": headline, "blocks": blocks}


def _slack_objective(payload: dict[str, Any]) -> dict[str, Any]:
    """An objective's breach (api/services/fleet/breaches.py): what it is, how far, and who spent the budget."""
    data = payload["data"]
    objective, status = data["objective"], data["status"]
    name = _slack_escape(f"{objective['project']}/{objective['name']}")
    ettr = status.get("ettr")
    headline = f":chart_with_downwards_trend: {name}: ETTR objective breached ({data['breach']['reason']})"
    facts = [
        f"ETTR {ettr:.3f}" if isinstance(ettr, int | float) else "ETTR -",
        f"target {objective['target']}",
        f"window {objective['window']}",
    ]
    if isinstance(status.get("budget_left"), int | float):
        facts.append(f"budget left {status['budget_left'] * 100:.0f} %")
    spent = ", ".join(
        f"{_slack_escape(str(j['name']))} {j['lost_gpu_hours']:.1f} GPU-h" for j in data.get("jobs", [])[:5]
    )
    causes = ", ".join(f"{_slack_escape(str(c))} {h:.1f}" for c, h in list(data.get("causes", {}).items())[:5])
    text = f"*{name}*: ETTR objective breached\nlost GPU-hours by cause: {causes or '-'}\nspent by: {spent or '-'}"
    blocks: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": text}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(facts)}]},
    ]
    return {"text": headline, "blocks": blocks}


def render(payload: dict[str, Any], fmt: str) -> bytes:
    body = slack_payload(payload) if fmt == "slack" else payload
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str).encode("utf-8")


def signed_headers(secret: str, webhook_id: str, body: bytes, at: datetime | None = None) -> dict[str, str]:
    at = at or utcnow()
    signature = Webhook(secret).sign(msg_id=webhook_id, timestamp=at, data=body.decode("utf-8"))
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": webhook_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }
