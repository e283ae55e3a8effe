"""Facts read from Kubernetes objects as the API returns them (plain dicts): times, a pod's completion index,
conditions, the trainer container's state and the init containers'. No API calls, no judgement."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from workers.backends.kubernetes import manifests as m


def parse_ts(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def iso(ts: datetime | None) -> str | None:
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z") if ts else None


def event_time(ev: dict[str, Any]) -> datetime:
    """When an Event happened (its newest time stamp), the earliest possible time when it has none."""
    for value in (
        ev.get("lastTimestamp"),
        ev.get("eventTime"),
        ev.get("firstTimestamp"),
        (ev.get("metadata") or {}).get("creationTimestamp"),
    ):
        ts = parse_ts(value)
        if ts:
            return ts
    return datetime.min.replace(tzinfo=UTC)


def completion_index(pod: dict[str, Any]) -> int | None:
    meta = pod.get("metadata", {})
    raw = (meta.get("labels") or {}).get(m.COMPLETION_INDEX_LABEL) or (meta.get("annotations") or {}).get(
        m.COMPLETION_INDEX_ANNOTATION
    )
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The object's condition of type `kind` when it is true."""
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def true_conditions(pod: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    conditions = pod.get("status", {}).get("conditions") or []
    return [c for c in conditions if c.get("type") == kind and c.get("status") == "True"]


def phase(pod: dict[str, Any]) -> str | None:
    value = pod.get("status", {}).get("phase")
    return str(value) if value else None


def trainer_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The trainer container's status (the pod's first container's when none is named so)."""
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for cs in statuses:
        if cs.get("name") == m.CONTAINER_NAME:
            return dict(cs)
    return dict(statuses[0]) if statuses else {}


def init_failure(pod: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(name, terminated state) of the init container that failed, if one did."""
    for cs in pod.get("status", {}).get("initContainerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return str(cs.get("name")), dict(term)
    return None


def waiting_reason(pod: dict[str, Any]) -> tuple[str, str]:
    """(reason, message) of the trainer container, or of an init container, that is waiting."""
    for cs in [trainer_status(pod), *(pod.get("status", {}).get("initContainerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") and waiting["reason"] != "PodInitializing":
            return str(waiting["reason"]), str(waiting.get("message") or "")
    return "", ""


def started_at(pod: dict[str, Any]) -> datetime | None:
    state = trainer_status(pod).get("state") or {}
    for key in ("running", "terminated"):
        if state.get(key) and state[key].get("startedAt"):
            return parse_ts(state[key]["startedAt"])
    return None
