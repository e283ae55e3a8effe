"""The fake Kubernetes API served over HTTP in-process, for the real `kubernetes` client: `FakeKube`.

Routes the paths the backend uses to the store: core/v1 pods (and their `eviction` subresource),
services, secrets and events in a namespace, nodes (cluster-scoped), batch/v1 jobs, and Kueue's
workloads; GET, list (label and field selectors, pages with `limit` and `continue`, `resourceVersion`
accepted), POST, PUT, PATCH, DELETE.
What a real API server refuses is refused with the same `Status` (`validation`): 400/422, never a
dropped connection. Tests inject API errors or delays on chosen calls (`fail`, `delay`) and read every
request back from `requests`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s_client

from tests.fake_kubernetes.errors import ApiError
from tests.fake_kubernetes.kueue import Kueue
from tests.fake_kubernetes.store import KINDS, match_fields

CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|services|secrets|events)(?:/([^/]+))?(?:/(eviction|status))?$")
NODES = re.compile(r"^/api/v1/(nodes)(?:/([^/]+))?$")
BATCH = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/(jobs)(?:/([^/]+))?$")
KUEUE = re.compile(r"^/apis/kueue\.x-k8s\.io/v1beta1/namespaces/([^/]+)/(workloads)(?:/([^/]+))?$")
REASONS = {
    404: "NotFound",
    409: "AlreadyExists",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
}


@dataclass
class Rule:
    """An injected API failure: `status` (or a `delay` in seconds) for matching requests, `times` times."""

    method: str
    path: re.Pattern[str]
    status: int | None = None
    times: int = 1
    delay: float = 0.0
    retry_after: int | None = None
    after: bool = False  # delay the answer after the request took effect (a reply lost on the way back)
    hits: int = 0


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    body: Any
    status: int = 0


class FakeKube(Kueue):
    """A small, stateful Kubernetes API: the fake cluster behind an HTTP server on a free local port."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        super().__init__(nodes)
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.server: ThreadingHTTPServer | None = None

    # --- server life

    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            kube = fake

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02})
        serve.daemon = True
        serve.start()
        return self

    def stop(self) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    @property
    def url(self) -> str:
        assert self.server
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def api_client(self) -> k8s_client.ApiClient:
        cfg = k8s_client.Configuration(host=self.url)
        cfg.retries = False
        return k8s_client.ApiClient(cfg)

    # --- error injection

    def fail(
        self,
        method: str,
        path: str,
        status: int | None = 500,
        *,
        times: int = 1,
        delay: float = 0.0,
        retry_after: int | None = None,
        after: bool = False,
    ) -> Rule:
        rule = Rule(method.upper(), re.compile(path), status, times, delay, retry_after, after)
        with self.lock:
            self.rules.append(rule)
        return rule

    def delay(self, method: str, path: str, seconds: float, *, times: int = 1, after: bool = False) -> Rule:
        return self.fail(method, path, status=None, times=times, delay=seconds, after=after)

    def _rule_for(self, method: str, path: str) -> Rule | None:
        with self.lock:
            for rule in self.rules:
                if rule.method in (method, "*") and rule.path.search(path) and rule.hits < rule.times:
                    rule.hits += 1
                    return rule
        return None


def _first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


class _Handler(BaseHTTPRequestHandler):
    kube: FakeKube
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 1 << 16  # one write per response (flushed by the server after each request)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, method: str) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        record = Request(method, url.path, query, None)
        self.kube.requests.append(record)
        try:
            record.body = json.loads(raw) if raw else None
        except ValueError as exc:
            record.status = 400
            self._send(400, ApiError(400, "BadRequest", f"the body is not JSON: {exc}").status())
            return
        rule = self.kube._rule_for(method, url.path)
        if rule is not None:
            if rule.delay and not rule.after:
                time.sleep(rule.delay)
            if rule.status:
                record.status = rule.status
                headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else {}
                error = ApiError(rule.status, REASONS.get(rule.status, "InternalError"), f"injected {rule.status}")
                with contextlib.suppress(OSError):
                    self._send(rule.status, error.status(), headers)
                return
        try:
            code, out = self._route(method, url.path, query, record.body)
        except ApiError as exc:
            code, out = exc.code, exc.status()
        record.status = code
        if rule is not None and rule.after:
            time.sleep(rule.delay)
        try:
            self._send(code, out)
        except OSError:  # the client gave up (an injected delay): nothing to answer
            self.close_connection = True

    def _route(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, Any]:
        kube = self.kube
        sub = None
        if m := CORE.match(path):
            ns, plural, name, sub = m.group(1), m.group(2), m.group(3), m.group(4)
        elif m := NODES.match(path):
            ns, plural, name = "", m.group(1), m.group(2)
        elif m := BATCH.match(path) or KUEUE.match(path):
            ns, plural, name = m.group(1), m.group(2), m.group(3)
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        if plural == "workloads" and not kube.kueue_installed:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind, api_version = KINDS[plural]
        if sub == "eviction":
            if method != "POST":
                raise ApiError(405, "MethodNotAllowed", method)
            if kube.get(plural, ns, name) is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found')
            kube.api_evict(ns, name)
            return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
        if method == "GET" and name:
            obj = kube.get(plural, ns, name)
            if obj is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return 200, obj
        if method == "GET":
            items = [
                o
                for o in kube.list(plural, ns or None, _first(query, "labelSelector"))
                if match_fields(_first(query, "fieldSelector"), o)
            ]
            meta: dict[str, Any] = {"resourceVersion": str(next(kube.rv))}
            limit = int(_first(query, "limit") or 0)
            if limit:  # pages: the token is where the next one starts
                token = _first(query, "continue")
                start = json.loads(base64.b64decode(token))["start"] if token else 0
                items, rest = items[start : start + limit], items[start + limit :]
                if rest:
                    meta["continue"] = base64.b64encode(json.dumps({"start": start + limit}).encode()).decode()
                    meta["remainingItemCount"] = len(rest)
            return 200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}
        if method == "POST":
            return 201, kube.create(plural, ns, body or {}, validate=True)
        if method == "PUT":
            return 200, kube.replace(plural, ns, name, body or {}, validate=True)
        if method == "PATCH":
            if not isinstance(body, dict):
                raise ApiError(415, "UnsupportedMediaType", "the fake applies merge patches (a JSON object) only")
            return 200, kube.patch(plural, ns, name, body, validate=True)
        if method == "DELETE":
            opts = body or {}
            policy = opts.get("propagationPolicy") or _first(query, "propagationPolicy")
            obj = kube.delete(plural, ns, name, policy)
            if plural == "pods":
                return 200, obj
            details = {"name": name, "kind": plural, "uid": obj["metadata"]["uid"]}
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success", "details": details}
        raise ApiError(405, "MethodNotAllowed", method)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")
