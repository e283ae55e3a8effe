"""The `pods/log` subresource: each container's log, as the kubelet keeps it and the API server serves it.

`GET /api/v1/namespaces/{ns}/pods/{name}/log` with the query of `PodLogOptions`, checked as the
API server checks it (pkg/apis/core/validation: ValidatePodLogOptions, a 422 `Invalid` naming
the field; pkg/registry/core/pod/strategy.go LogLocation: a container the pod does not have, or a
pod without a node, is a 400) and answered as the kubelet answers (a container still waiting is
a 400 naming its reason; `tailLines` counts from the end of the log, then `sinceSeconds` or
`sinceTime` (inclusive) drop older lines; `timestamps` puts each line's RFC 3339 time, in
nanoseconds with trailing zeros trimmed, and a space before it; `limitBytes` stops after that
many bytes). `follow` streams the log as it grows, chunked, until the container terminates or the
pod is deleted. A deleted pod's log is gone: 404. The lines are what tests write (`write_log`),
timestamped when written, as a container runtime stamps each line it reads.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from tests.fake_kubernetes.errors import ApiError

LOG_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")
POLL_S = 0.05


class Handler(Protocol):
    def send_response(self, code: int, message: str | None = None) -> None: ...
    def send_header(self, keyword: str, value: str) -> None: ...
    def end_headers(self) -> None: ...

    wfile: Any
    close_connection: bool


def rfc3339_nano(at: datetime) -> str:
    """Go's time.RFC3339Nano: nine fractional digits with trailing zeros trimmed (none when all are zero)."""
    text = at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{at.microsecond:06d}000".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


@dataclass
class PodLogs:
    """Every container's log lines, by (namespace, pod, container)."""

    lines: dict[tuple[str, str, str], list[tuple[datetime, str]]] = field(default_factory=dict)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def write(self, ns: str, pod: str, text: str, *, container: str = "trainer", at: datetime | None = None) -> None:
        with self.changed:
            self.lines.setdefault((ns, pod, container), []).append((at or datetime.now(UTC), text))
            self.changed.notify_all()

    def serve(self, handler: Handler, kube: Any, ns: str, name: str, query: dict[str, list[str]]) -> None:
        options = _options(query)
        container = self._container(kube, ns, name, options.get("container"))
        with self.changed:
            lines = list(self.lines.get((ns, name, container), []))
        since = options.get("since")
        if options.get("tail") is not None:
            lines = lines[-options["tail"] :] if options["tail"] else []
        if since is not None:
            lines = [(at, text) for at, text in lines if at >= since]
        sent = len(self.lines.get((ns, name, container), []))
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        budget = options.get("limit_bytes")
        try:
            budget = self._send(handler, lines, options, budget)
            while options["follow"] and budget != 0 and not self._over(kube, ns, name, container):
                with self.changed:
                    self.changed.wait(POLL_S)
                    fresh = self.lines.get((ns, name, container), [])[sent:]
                sent += len(fresh)
                budget = self._send(handler, fresh, options, budget)
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except OSError:  # the client went away
            handler.close_connection = True

    @staticmethod
    def _send(
        handler: Handler, lines: list[tuple[datetime, str]], options: dict[str, Any], budget: int | None
    ) -> int | None:
        for at, text in lines:
            data = (f"{rfc3339_nano(at)} {text}\n" if options["timestamps"] else f"{text}\n").encode()
            if budget is not None:
                data, budget = data[:budget], max(0, budget - len(data))
            if data:
                handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            if budget == 0:
                break
        handler.wfile.flush()
        return budget

    @staticmethod
    def _container(kube: Any, ns: str, name: str, container: str | None) -> str:
        pod = kube.get("pods", ns, name)
        if pod is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])]
        if container is None:
            if len(spec.get("containers", [])) != 1:
                raise ApiError(400, "BadRequest", f"a container name must be specified for pod {name}")
            container = spec["containers"][0]["name"]
        elif container not in names:
            raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if not spec.get("nodeName"):
            raise ApiError(400, "BadRequest", f"pod {name} does not have a host assigned")
        state = _state(pod, container)
        if not state or "waiting" in state:
            reason = (state or {}).get("waiting", {}).get("reason") or "ContainerCreating"
            raise ApiError(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start: {reason}')
        return container

    @staticmethod
    def _over(kube: Any, ns: str, name: str, container: str) -> bool:
        pod = kube.get("pods", ns, name)
        return pod is None or "terminated" in _state(pod, container)


def _state(pod: dict[str, Any], container: str) -> dict[str, Any]:
    status = pod.get("status") or {}
    for entry in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        if entry.get("name") == container:
            return dict(entry.get("state") or {})
    return {}


def _options(query: dict[str, list[str]]) -> dict[str, Any]:
    """PodLogOptions from the query, validated as the API server does (a 422 naming each field)."""

    def first(key: str) -> str | None:
        values = query.get(key)
        return values[0] if values else None

    def number(key: str) -> int | None:
        value = first(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ApiError(400, "BadRequest", f'unable to parse "{value}" for {key}') from None

    causes = []
    tail, limit_bytes, since_seconds = number("tailLines"), number("limitBytes"), number("sinceSeconds")
    since_time = first("sinceTime")
    if tail is not None and tail < 0:
        causes.append(("tailLines", "must be greater than or equal to 0"))
    if limit_bytes is not None and limit_bytes < 1:
        causes.append(("limitBytes", "must be greater than 0"))
    if since_seconds is not None and since_time is not None:
        causes.append(("", "at most one of `sinceTime` or `sinceSeconds` may be specified"))
    elif since_seconds is not None and since_seconds < 1:
        causes.append(("sinceSeconds", "must be greater than 0"))
    if causes:
        message = "; ".join(f"{f}: Invalid value: {m}" if f else m for f, m in causes)
        raise ApiError(422, "Invalid", f"PodLogOptions is invalid: {message}")
    since = None
    if since_seconds is not None:
        since = datetime.now(UTC) - timedelta(seconds=since_seconds)
    elif since_time is not None:
        try:
            since = datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        except ValueError:
            raise ApiError(400, "BadRequest", f'parsing time "{since_time}" as RFC 3339 failed') from None
    truthy = ("true", "1")
    return {
        "container": first("container"),
        "follow": (first("follow") or "").lower() in truthy,
        "timestamps": (first("timestamps") or "").lower() in truthy,
        "tail": tail,
        "limit_bytes": limit_bytes,
        "since": since,
    }
