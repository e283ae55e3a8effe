"""PostgreSQL connection loss: requests fail cleanly (503, Retry-After, a JSON error) and the service
heals by itself when the database is back, without a restart.

The app reaches PostgreSQL through a TCP proxy that the test cuts (connections reset, port closed,
as when the database restarts or its host is gone), stalls (connections accepted and never answered,
as from a host that is up but a server that is not) and restores. The shared PostgreSQL server is
never touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from ftplane.trainer.agent.uplink import Uplink
from tests.conftest import configure_env, tiny_spec
from tests.reliability.conftest import TcpProxy
from tests.support.inprocess_transport import InProcessTransport
from tests.support.waiting import wait_for

pytestmark = pytest.mark.postgres

CONNECT_TIMEOUT_S = 2  # the app's, set by `through_proxy`: the mechanism under test (5 s in production)
# How long one request may take while the connection is refused: no wait of any kind, with room for a loaded host.
FAIL_FAST_S = 4.0
# Past this a request hangs: what a silent database without the connect timeout does (TCP waits minutes).
HANG_S = 30.0


def assert_clean_503(response: httpx.Response, what: str) -> None:
    assert response.status_code == 503, f"{what}: {response.status_code} {response.text[:300]}"
    assert int(response.headers["Retry-After"]) >= 1, what
    error = response.json()["error"]
    assert error["status"] == 503 and "database" in error["message"], what


@pytest.fixture
def through_proxy(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, proxy_factory: Callable[[str, int], TcpProxy]
) -> tuple[TcpProxy, TestClient, dict[str, Any]]:
    real = make_url(postgres_url)
    proxy = proxy_factory(real.host or "127.0.0.1", real.port or 5432)
    url = real.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    configure_env(monkeypatch, tmp_path / "state", url)
    from api.core import db, queue
    from api.core.db import session_scope
    from api.main import create_app
    from api.models import tokens

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)  # no broker here; the database is the subject
    monkeypatch.setattr(db, "CONNECT_TIMEOUT_S", CONNECT_TIMEOUT_S)
    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    admin = TestClient(app, headers={"Authorization": f"Bearer {token}"}, raise_server_exceptions=False)
    job = admin.post("/v1/jobs", json=tiny_spec()).json()
    return proxy, admin, job


def requests_while_down(
    admin: TestClient, job: dict[str, Any], proxy: TcpProxy
) -> tuple[dict[str, float], dict[str, int]]:
    """Every kind of request fails cleanly: reads, writes, trainer reports, auth itself. Returns what
    ran, with the seconds each took and the connections each left waiting at the stalled proxy."""
    trainer = TestClient(admin.app, headers={"Authorization": f"Bearer {job['token']}"}, raise_server_exceptions=False)
    unknown = {"Authorization": "Bearer ftp_admin_unknown"}
    stranger = TestClient(admin.app, headers=unknown, raise_server_exceptions=False)
    calls: list[tuple[str, Callable[[], httpx.Response]]] = [
        # Whether a token is valid cannot be known without the database: 503, never 401.
        ("authenticate an unknown token", lambda: stranger.get("/v1/jobs")),
        ("list jobs", lambda: admin.get("/v1/jobs")),
        ("describe job", lambda: admin.get(f"/v1/jobs/{job['id']}")),
        ("submit job", lambda: admin.post("/v1/jobs", json=tiny_spec(name="during"))),
        (
            "report events",
            lambda: trainer.post(
                f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "down", "type": "checkpoint_saved"}]}
            ),
        ),
        (
            "heartbeats",
            lambda: trainer.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 1}]}),
        ),
    ]
    took: dict[str, float] = {}
    stalled: dict[str, int] = {}
    for what, call in calls:
        started, before = time.monotonic(), proxy.stalled
        response = call()
        took[what], stalled[what] = time.monotonic() - started, proxy.stalled - before
        assert_clean_503(response, what)
    assert admin.get("/healthz").status_code == 200  # the process is alive: no restart wanted
    ready = admin.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["database"].startswith("unreachable")
    return took, stalled


def summary(took: dict[str, float]) -> str:
    return f"{len(took)} kinds of request, each a 503 in at most {max(took.values()):.1f} s: {', '.join(took)}"


def healed(admin: TestClient, job: dict[str, Any]) -> None:
    """Back by itself: the next requests succeed, on the same app and pool."""
    wait_for("the API to answer again", lambda: admin.get("/v1/jobs").status_code == 200, timeout=15, interval=0.2)
    assert admin.get(f"/v1/jobs/{job['id']}").status_code == 200
    assert admin.get("/readyz").json()["checks"]["database"] == "ok"


def test_a_cut_connection_is_a_clean_503_and_the_service_heals(
    through_proxy: tuple[TcpProxy, TestClient, dict[str, Any]],
) -> None:
    proxy, admin, job = through_proxy
    assert admin.get("/v1/jobs").status_code == 200  # pooled connections exist through the proxy
    for _ in range(2):  # twice: recovery leaves nothing behind that breaks the next outage
        proxy.cut()
        ran, _ = requests_while_down(admin, job, proxy)
        slow = {what: s for what, s in ran.items() if s >= FAIL_FAST_S}
        assert not slow, f"a refused connection answered late: {slow}"
        proxy.restore()
        healed(admin, job)
    print(f"\ncut database, twice: {summary(ran)}")


def test_a_silent_database_is_a_503_within_the_connect_timeout(
    through_proxy: tuple[TcpProxy, TestClient, dict[str, Any]],
) -> None:
    proxy, admin, job = through_proxy
    assert admin.get("/v1/jobs").status_code == 200
    proxy.stall()  # existing connections reset; new ones accepted and never answered
    ran, stalled = requests_while_down(admin, job, proxy)  # each waits out the connect timeout, then 503
    # One connection each, given up after the timeout: wall time on a loaded host only adds to it, so the attempts
    # are counted, and the time is bounded below by the timeout and above by a hang.
    assert stalled == dict.fromkeys(ran, 1), stalled
    assert all(CONNECT_TIMEOUT_S * 0.9 <= s < HANG_S for s in ran.values()), ran
    proxy.restore()
    healed(admin, job)
    print(f"\nstalled database (connect timeout {CONNECT_TIMEOUT_S} s): {summary(ran)}")


def test_reports_sent_during_the_outage_arrive_once_after_it(
    through_proxy: tuple[TcpProxy, TestClient, dict[str, Any]],
) -> None:
    """The node agent's uplink gets 503s with Retry-After while the database is away, keeps the
    events, and delivers each once when it is back."""
    proxy, admin, job = through_proxy
    transport = InProcessTransport(admin.app, raise_server_exceptions=False)
    reporter = Uplink("http://testserver", job["id"], 0, job["token"], "node-a", transport=transport, backoff_cap_s=1.0)
    keys = [reporter.event("checkpoint_saved", rank=0, step=step) for step in range(5)]
    assert reporter.flush(10)
    proxy.cut()
    keys += [reporter.event("checkpoint_saved", rank=0, step=step) for step in range(5, 15)]
    time.sleep(3)  # retried against 503s meanwhile
    assert reporter.pending()[0] == 10
    proxy.restore()
    assert reporter.flush(30), "the uplink did not deliver after the database came back"
    reporter.close()
    stored = admin.get(f"/v1/jobs/{job['id']}/events", params={"limit": 100}).json()["items"]
    assert sorted(e["key"] for e in stored) == sorted(keys)
