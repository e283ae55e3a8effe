"""The Kubernetes backend's logs: the trainer containers' logs, read through the API server (`pods/log`).

Each pod's container log is its node agent's output: the agent's own lines, the launcher's, and
each rank's as `[rank<R> c<cycle>]:<line>` (already redacted on the node; trainer/agent/rank_logs.py,
ECHO_PREFIX: the launcher cycle that printed it, 0 until the first in-job restart). They are read with
`timestamps=true` (the kubelet's time of each line), and `tailLines`, `sinceSeconds` (the
client's form of a start time: the pods API of the `kubernetes` client has no `sinceTime`) and
`follow` are passed through; the exact window, the rank and the order are then applied here. A
rank's lines are read from the one pod that hosts it (api/schemas/kubernetes_names.py). A line an
older agent echoed as `[rank<R>]:<line>` has no cycle: null (a `cycle` filter leaves it out). When the
attempt has no pods left (a job restart
deleted them), `read` returns None and the caller answers from the failure tails stored in events.

The client is blocking: a follow reads each pod's stream on a thread of its own, and the lines
reach the response through a queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import threading
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, cast

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from api.core.config import get_settings
from api.core.kube import KubeConfigError, load_api_client
from api.schemas import kubernetes_names as names
from api.services.logs.lines import Key, LogLine, LogQuery, LogStream, LogTarget, page

RANK_LINE = re.compile(r"^\[rank(\d+)(?: c(\d+))?\]:(.*)$")
REQUEST_TIMEOUT = (5.0, 60.0)
TICK_S = 0.5
WAITING_RETRY_S = 2.0
# Lines asked of each pod for a tail of N: its ranks' N each, and room for the agent's and launcher's own.
OTHER_LINES = 200


class KubernetesLogsError(RuntimeError):
    pass


@lru_cache(maxsize=1)
def api_client() -> k8s_client.ApiClient:
    """The API server's client, as the worker loads it (api/core/kube.py)."""
    try:
        return load_api_client(get_settings())
    except KubeConfigError as exc:
        raise KubernetesLogsError(f"cannot read pod logs: {exc}") from exc


@dataclass(frozen=True)
class Pod:
    name: str
    node: str | None
    index: int | None


def parse(text: str) -> tuple[datetime, int, int | None, str] | None:
    """(time, rank, cycle, line) of one timestamped container log line that a rank printed (cycle None where the
    agent did not say it); None for any other line."""
    stamp, _, rest = text.rstrip("\r\n").partition(" ")
    found = RANK_LINE.match(rest)
    if found is None:
        return None
    try:
        ts = datetime.fromisoformat(stamp)
    except ValueError:
        return None
    cycle = int(found[2]) if found[2] is not None else None
    return ts if ts.tzinfo else ts.replace(tzinfo=UTC), int(found[1]), cycle, found[3]


class PodLogs:
    def __init__(self, target: LogTarget, query: LogQuery, api: k8s_client.ApiClient | None = None) -> None:
        self.target = target
        self.query = query
        self.core = k8s_client.CoreV1Api(api or api_client())
        self.namespace = target.namespace or "default"
        self.pods = self._pods()

    def _pods(self) -> list[Pod]:
        try:
            response = self.core.list_namespaced_pod(
                self.namespace,
                label_selector=names.attempt_selector(self.target.job_id, self.query.attempt),
                _request_timeout=REQUEST_TIMEOUT,
                _preload_content=False,
            )
            items = json.loads(cast(Any, response).data)["items"]
        except ApiException as exc:
            raise KubernetesLogsError(f"listing the attempt's pods failed: HTTP {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError, ValueError, KeyError) as exc:
            raise KubernetesLogsError(f"listing the attempt's pods failed: {exc}") from exc
        pods = []
        for item in items:
            meta, spec = item.get("metadata") or {}, item.get("spec") or {}
            index = (meta.get("labels") or {}).get(names.COMPLETION_INDEX_LABEL)
            node = spec.get("nodeName")
            pods.append(Pod(str(meta.get("name")), node, int(str(index)) if str(index).isdigit() else None))
        return sorted(pods, key=lambda p: (p.index if p.index is not None else math.inf, p.name))

    def selected(self) -> list[Pod]:
        pods = [p for p in self.pods if self.query.node is None or p.node == self.query.node]
        if self.query.rank is not None:
            index = names.pod_index_for_rank(self.target.nodes, self.target.procs_per_node, self.query.rank)
            pods = [p for p in pods if p.index == index] or pods
        return pods

    def _options(self, *, follow: bool, since: datetime | None, tail: int | None) -> dict[str, Any]:
        options: dict[str, Any] = {"container": names.CONTAINER_NAME, "timestamps": True, "follow": follow}
        if since is not None:
            options["since_seconds"] = max(1, math.ceil((datetime.now(UTC) - since).total_seconds()) + 1)
        if tail is not None:
            per_pod = self.target.procs_per_node if self.query.rank is None else 1
            options["tail_lines"] = tail * per_pod + OTHER_LINES
        return options

    def _lines(self, pod: Pod, raw: Iterator[str]) -> Iterator[LogLine]:
        seen: dict[tuple[datetime, int], int] = {}
        for text in raw:
            parsed = parse(text)
            if parsed is None:
                continue
            ts, rank, cycle, line = parsed
            seq = seen[(ts, rank)] = seen.get((ts, rank), -1) + 1
            found = LogLine(ts, rank, seq, pod.node, self.query.attempt, cycle, line)
            if self.query.wants(found):
                yield found

    def _read(self, pod: Pod, options: dict[str, Any]) -> list[LogLine]:
        try:
            text = self.core.read_namespaced_pod_log(
                pod.name, self.namespace, _request_timeout=REQUEST_TIMEOUT, **options
            )
        except ApiException as exc:
            if exc.status in (400, 404):  # not started yet, or gone meanwhile: nothing to read there
                return []
            raise KubernetesLogsError(f"reading pod {pod.name}'s log failed: HTTP {exc.status} {exc.reason}") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubernetesLogsError(f"reading pod {pod.name}'s log failed: {exc}") from exc
        return list(self._lines(pod, iter(str(text).splitlines())))

    def read(self) -> LogStream | None:
        """The page from the pods' logs, or None when the attempt has no pods left."""
        pods = self.selected()
        if not pods:
            return None
        query = self.query
        since = query.after[0] if query.after is not None else query.since
        wanted = min(query.tail if query.tail is not None else query.limit, query.limit) if query.follow else query.tail
        options = self._options(follow=False, since=since, tail=wanted)
        lines = sorted((line for pod in pods for line in self._read(pod, options)), key=lambda x: x.key)
        if wanted is not None:
            lines = lines[-wanted:] if wanted else []
            cursor = None
        else:
            lines, cursor = page(lines, query)
        found = sorted({p.node for p in self.pods if p.node})
        stream = LogStream("pod-logs", lines, cursor, nodes=found, pods=[p.name for p in pods])
        if query.follow:
            after = lines[-1].key if lines else None
            stream.follow = lambda: self.follow(pods, after[0] if after else datetime.now(UTC), after)
        return stream

    async def follow(self, pods: list[Pod], since: datetime, after: Key | None) -> AsyncGenerator[list[LogLine], None]:
        """What each pod's container prints from `since` on (after the page's last line), until every stream has
        ended (the containers stopped, or the pods went)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[LogLine | Pod] = asyncio.Queue()
        stop = threading.Event()
        responses: list[Any] = []
        options = self._options(follow=True, since=since, tail=None)

        def stream(pod: Pod) -> None:
            try:
                while not stop.is_set():
                    try:
                        response = self.core.read_namespaced_pod_log(
                            pod.name, self.namespace, _preload_content=False, **options
                        )
                    except ApiException as exc:
                        if exc.status == 400 and stop.wait(WAITING_RETRY_S):  # the container is not started yet
                            continue
                        return
                    responses.append(response)
                    lines = (bytes(raw).decode(errors="replace") for raw in cast(Iterable[bytes], response))
                    for line in self._lines(pod, lines):
                        if line.ts >= since and (after is None or line.key > after):
                            loop.call_soon_threadsafe(queue.put_nowait, line)
                    return
            except Exception:  # the connection closed under it (a stop, or the API server went)
                return
            finally:
                loop.call_soon_threadsafe(queue.put_nowait, pod)

        threads = [threading.Thread(target=stream, args=(p,), daemon=True, name="ftplane-pod-log") for p in pods]
        for thread in threads:
            thread.start()
        running = len(threads)
        try:
            while running:
                batch: list[LogLine] = []
                with contextlib.suppress(TimeoutError):
                    item = await asyncio.wait_for(queue.get(), TICK_S)
                    while True:
                        if isinstance(item, Pod):
                            running -= 1
                        else:
                            batch.append(item)
                        if queue.empty():
                            break
                        item = queue.get_nowait()
                batch.sort(key=lambda x: x.key)
                yield batch
        finally:
            stop.set()
            for response in responses:
                with contextlib.suppress(Exception):
                    response.close()
