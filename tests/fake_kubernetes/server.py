"""The fake Kubernetes API served over HTTP in-process, for the real `kubernetes` client: `FakeKube`.

Routes the paths the backend uses to the store: core/v1 pods (and their `eviction` and `log`
subresources, the log in pod_logs.py), services, secrets and events in a namespace, nodes (cluster-scoped),
batch/v1 jobs, and Kueue's workloads, queues and flavors; GET, list (label and field selectors, pages with
`limit` and `continue`, `resourceVersion` accepted), watch, POST, PUT, PATCH, DELETE.

A watch (`?watch=true`) streams JSON lines as kube-apiserver does
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes): from its
`resourceVersion`, ADDED, MODIFIED and DELETED (with the object's last state) for what the selectors select,
BOOKMARK events with a newer resourceVersion when `allowWatchBookmarks` is set, and an ERROR carrying a 410
Gone `Status` when that resourceVersion was compacted away (the client must list again); it ends after
`timeoutSeconds`. Changes are sent as the store has them (several changes of one object between two looks
arrive as one MODIFIED), and bookmarks come whenever the store moved, far more often than a real server's
(about once a minute): tests can wait for a watch to catch up. A bookmark is what kube-apiserver sends
(https://kubernetes.io/docs/reference/using-api/api-concepts/#watch-bookmarks): the kind and apiVersion of
the collection and a metadata holding only the resourceVersion. `cut_watches()` plays a watch connection lost
for a while (a network partition, an API server restart): the open watches send nothing until it ends, then
end, and the clients watch again from the resourceVersion they had; with `compact()` meanwhile, that is the
410 Gone a client meets mid-attempt. Every answer's size is counted (`Request.bytes`).

Events are served as kube-apiserver serves them by default, without a watch cache: every list of Events reads
all the namespace's Events (etcd) before its field selector applies, whatever its resourceVersion; the lists
and the bytes so read are counted (`event_lists`, `event_bytes_scanned`).
What a real API server refuses is refused with the same `Status` (`validation`): 400/422, never a
dropped connection. Tests inject API errors or delays on chosen calls (`fail`, `delay`) and read every
request back from `requests`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client as k8s_client

from tests.fake_kubernetes.errors import ApiError
from tests.fake_kubernetes.kueue import Kueue
from tests.fake_kubernetes.pod_logs import LOG_PATH, PodLogs
from tests.fake_kubernetes.store import KINDS, match_fields, match_labels

CORE = re.compile(r"^/api/v1/namespaces/([^/]+)/(pods|services|secrets|events)(?:/([^/]+))?(?:/(eviction|status))?$")
NODES = re.compile(r"^/api/v1/(nodes)(?:/([^/]+))?$")
BATCH = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/(jobs)(?:/([^/]+))?$")
KUEUE = re.compile(
    r"^/apis/kueue\.x-k8s\.io/(v1beta1|v1beta2)/(?:namespaces/([^/]+)/)?"
    r"(workloads|localqueues|clusterqueues|resourceflavors)(?:/([^/]+))?$"
)
KUEUE_GROUP = "/apis/kueue.x-k8s.io"
BUILT_IN_GROUPS = ("batch",)
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
    bytes: int = 0  # of the answer's body (a watch: every line it streamed)


class FakeKube(Kueue):
    """A small, stateful Kubernetes API: the fake cluster behind an HTTP server on a free local port."""

    def __init__(self, nodes: list[str] | None = None) -> None:
        super().__init__(nodes)
        self.rules: list[Rule] = []
        self.requests: list[Request] = []
        self.stopped = False
        self.watches_cut = False  # open watches send nothing (`cut_watches`)
        self.watch_cuts = 0  # cuts ended: a watch open during one ends with it
        self.event_lists = 0  # lists of Events served (each from etcd: no watch cache for Events)
        self.event_bytes_scanned = 0  # the Events etcd read for them, before field selectors
        self.server: ThreadingHTTPServer | None = None
        self.pod_logs = PodLogs()  # the containers' logs, served at pods/{name}/log

    # --- server life

    def start(self) -> FakeKube:
        fake = self

        class Handler(_Handler):
            kube = fake

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02})
        serve.daemon = True
        serve.start()
        return self

    def stop(self) -> None:
        self.stopped = True  # open watches end
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    @contextlib.contextmanager
    def cut_watches(self) -> Iterator[None]:
        """The watches' connections lost while inside: nothing reaches their clients (what changes meanwhile is
        never streamed to them), and on leaving, every watch open during the cut ends: its client watches again
        from the resourceVersion it had, and is answered 410 Gone if that was compacted meanwhile."""
        with self.lock:  # a watch reads the store under the lock: no change made inside reaches it
            self.watches_cut = True
        try:
            yield
        finally:
            with self.lock:
                self.watch_cuts += 1
                self.watches_cut = False

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


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a watch it stopped reading) is no error of the server's."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, ConnectionError):
            super().handle_error(request, client_address)


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

    record: Request | None = None

    def _send(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        if self.record is not None:
            self.record.bytes += len(data)
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
        self.record = record
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
        if method == "GET" and _first(query, "watch") in ("true", "1"):
            try:
                self._watch(url.path, query)
            except OSError:  # the client went away
                self.close_connection = True
            return
        if method == "GET" and (log := LOG_PATH.match(url.path)):  # a streamed answer: pod_logs.py writes it
            try:
                self.kube.pod_logs.serve(self, self.kube, log[1], log[2], query)
                record.status = 200
            except ApiError as exc:
                record.status = exc.code
                self._send(exc.code, exc.status())
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
        elif m := BATCH.match(path):
            ns, plural, name = m.group(1), m.group(2), m.group(3)
        elif m := KUEUE.match(path):
            if not kube.kueue_installed or m.group(1) not in kube.kueue_versions:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            ns, plural, name = m.group(2) or "", m.group(3), m.group(4)
            served = f"kueue.x-k8s.io/{m.group(1)}"
            code, out = self._route_kind(method, plural, ns, name, sub, query, body)
            for item in [out, *(out.get("items") or [])]:  # what was asked for, in the version it was asked in
                if item.get("apiVersion", "").startswith("kueue.x-k8s.io/"):
                    item["apiVersion"] = served
            return code, out
        elif path.rstrip("/") in ("/apis", KUEUE_GROUP):
            return 200, self._discovery(path.rstrip("/"))
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return self._route_kind(method, plural, ns, name, sub, query, body)

    def _route_kind(
        self,
        method: str,
        plural: str,
        ns: str,
        name: Any,  # a path's name, or None for the collection
        sub: str | None,
        query: dict[str, list[str]],
        body: Any,
    ) -> tuple[int, Any]:
        kube = self.kube
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
        if method == "GET" and plural == "events":
            # no watch cache for Events (kube-apiserver's default): etcd reads the namespace's every Event, and
            # the field selector filters them after
            scanned = kube.list(plural, ns or None)
            kube.event_lists += 1
            kube.event_bytes_scanned += sum(len(json.dumps(e)) for e in scanned)
        if method == "GET":
            items = [
                o
                for o in kube.list(plural, ns or None, _first(query, "labelSelector"))
                if match_fields(_first(query, "fieldSelector"), o)
            ]
            meta: dict[str, Any] = {"resourceVersion": str(kube.current_rv())}
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

    def _discovery(self, path: str) -> dict[str, Any]:
        """/apis (APIGroupList) and /apis/kueue.x-k8s.io (APIGroup): the groups and versions served."""
        kube = self.kube

        def group(name: str, versions: tuple[str, ...]) -> dict[str, Any]:
            listed = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
            return {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": name,
                "versions": listed,
                "preferredVersion": listed[0],
            }

        if path == KUEUE_GROUP:
            if not kube.kueue_installed:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return group("kueue.x-k8s.io", kube.kueue_versions)
        groups = [group(g, ("v1",)) for g in BUILT_IN_GROUPS]
        if kube.kueue_installed:
            groups.append(group("kueue.x-k8s.io", kube.kueue_versions))
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _chunk(self, line: dict[str, Any]) -> None:
        data = json.dumps(line).encode() + b"\n"
        assert self.record is not None
        self.record.bytes += len(data)
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, path: str, query: dict[str, list[str]]) -> None:
        """A watch of a collection, streamed until `timeoutSeconds` (see the module's docstring)."""
        kube = self.kube
        if m := CORE.match(path):
            ns, plural = m.group(1), m.group(2)
        elif m := NODES.match(path):
            ns, plural = "", m.group(1)
        elif m := BATCH.match(path):
            ns, plural = m.group(1), m.group(2)
        elif m := KUEUE.match(path):
            ns, plural = m.group(2) or "", m.group(3)
        else:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        labels, fields = _first(query, "labelSelector"), _first(query, "fieldSelector")
        since = int(_first(query, "resourceVersion") or 0)
        bookmarks = _first(query, "allowWatchBookmarks") == "true"
        deadline = time.monotonic() + float(_first(query, "timeoutSeconds") or 1800)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        kind, api_version = KINDS[plural]

        def selected(obj: dict[str, Any]) -> bool:
            return match_labels(labels, obj["metadata"].get("labels") or {}) and match_fields(fields, obj)

        if since and since < kube.compacted:
            status = ApiError(410, "Expired", f"too old resource version: {since} ({kube.compacted})").status()
            self._chunk({"type": "ERROR", "object": status})
        else:
            sent, marked = since, since
            cuts = kube.watch_cuts
            while time.monotonic() < deadline and not kube.stopped:
                with kube.lock:  # the cut is checked with the store read: a change made during it is never sent
                    if kube.watch_cuts != cuts:  # its connection was lost: the client must watch again
                        break
                    cut = kube.watches_cut
                    if not cut:
                        lines = kube.changes_since(plural, ns, sent, since, selected)
                        now_rv = kube.current_rv()
                if cut:
                    time.sleep(0.02)
                    continue
                for rv, line in lines:
                    self._chunk(line)
                    sent = max(sent, rv)
                if bookmarks and now_rv > marked:  # the store moved: tell the client how far it got
                    meta = {"resourceVersion": str(now_rv)}
                    self._chunk(
                        {"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": meta}}
                    )
                    sent = marked = now_rv
                time.sleep(0.02)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True

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
