"""Fixtures and helpers shared by tests/webhooks, tests/dashboard and tests/metrics.

Each test gets its own SQLite database and embedded broker under tmp_path. Webhook deliveries
are not sent to a broker in unit tests: `enqueued` captures them and tests run the delivery
task in-process (eagerly). One end-to-end test runs a real Celery worker.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import configure_env


def point_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **extra: str) -> None:
    """Point settings, database (SQLite) and broker at this test's own state; receivers are on 127.0.0.1."""
    configure_env(
        monkeypatch,
        tmp_path / "state",
        f"sqlite:///{tmp_path / 'ftplane.db'}",
        FTPLANE_WEBHOOK_ALLOW_PRIVATE="true",
        **extra,
    )


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    point_at(monkeypatch, tmp_path)
    yield tmp_path
    from api.core.db import reset_caches

    reset_caches()


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Delivery tasks the code asked for (id, countdown), instead of sending them to a broker."""
    from api.webhooks import outbox

    calls: list[tuple[str, float | None]] = []

    def capture(delivery_id: str, countdown: float | None = None) -> bool:
        calls.append((delivery_id, countdown))
        return True

    monkeypatch.setattr(outbox, "enqueue", capture)
    return calls


@pytest.fixture
def app(env: Path, enqueued: list[tuple[str, float | None]]) -> Any:
    """The app of tests/conftest.py (whose client, admin and make_job fixtures use this one), with
    webhook deliveries captured."""
    from api.main import create_app

    return create_app()


def start(job: dict[str, Any]) -> None:
    """What the launch does (PENDING -> SUBMITTED), without launching anything."""
    from api.core.db import session_scope
    from api.models import jobs as job_store
    from api.services import lifecycle

    with session_scope() as session:
        row = job_store.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)


def post_events(client: TestClient, job: dict[str, Any], *events: dict[str, Any]) -> dict[str, Any]:
    """Report events with the job's own trainer token, as a trainer would."""
    response = client.post(
        f"/v1/jobs/{job['id']}/events",
        json={"events": list(events)},
        headers={"Authorization": f"Bearer {job['token']}"},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())


# ---- a real local HTTP receiver ----------------------------------------------------------------


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Answers each path with the next scripted status (then 200), recording every request."""

    url: str
    requests: list[Received] = field(default_factory=list)
    script: dict[str, list[int]] = field(default_factory=dict)
    delay_s: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def at(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.requests if r.path == path]

    def wait_for(self, path: str, count: int, timeout: float) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.at(path)
            if len(got) >= count:
                return got
            time.sleep(0.02)
        raise AssertionError(f"{path} got {len(self.at(path))} requests in {timeout} s, wanted {count}")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server API)
            rec = state["receiver"]
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            with rec.lock:
                headers = {k.lower(): v for k, v in self.headers.items()}
                rec.requests.append(Received(self.path, headers, body, time.monotonic()))
                script = rec.script.get(self.path, [])
                status = script.pop(0) if script else 200
            time.sleep(rec.delay_s.get(self.path, 0))
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", rec.url + "/elsewhere")
            payload = b"receiver says no" if status >= 400 else b"ok"
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state["receiver"] = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state["receiver"]
    finally:
        server.shutdown()
        server.server_close()
