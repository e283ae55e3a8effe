"""The dashboard's pages and partials over HTTP: login cookie, redirects, what each page shows."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.deps import SESSION_COOKIE
from api.schemas.goodput import LOST_BUCKETS, GoodputOut
from tests.dashboard.scenario import job_with_restarts


@pytest.fixture
def browser(client: TestClient) -> TestClient:
    """The TestClient as a browser: no Authorization header, cookies kept, redirects not followed."""
    client.headers.pop("Authorization", None)
    client.follow_redirects = False
    return client


def log_in(client: TestClient, token: str) -> None:
    response = client.post("/login", data={"token": token, "next": "/"})
    assert response.status_code == 303, response.text
    assert response.headers["location"] == "/fleet"  # the tests' token is a cluster admin's: the fleet page first


def test_pages_redirect_to_login_without_a_session(browser: TestClient) -> None:
    for path in ("/", "/jobs/abc", "/?status=RUNNING"):
        response = browser.get(path)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/login?next=/")
    partial = browser.get("/ui/jobs")
    assert partial.status_code == 401 and partial.headers["hx-redirect"] == "/login?next=/ui/jobs"
    assert browser.get("/login").status_code == 200


def test_login_sets_an_http_only_strict_cookie_and_logout_clears_it(browser: TestClient, admin_token: str) -> None:
    response = browser.post("/login", data={"token": admin_token, "next": "/jobs/x"})
    assert response.status_code == 303 and response.headers["location"] == "/jobs/x"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/", "Max-Age="):
        assert attribute.lower() in cookie.lower(), cookie
    assert "secure" not in cookie.lower()  # plain http here; set on https
    assert browser.get("/").status_code == 200
    assert browser.get("/v1/jobs").status_code == 200  # the API takes the same cookie

    response = browser.post("/logout")
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert f'{SESSION_COOKIE}=""' in response.headers["set-cookie"] or "Max-Age=0" in response.headers["set-cookie"]
    assert browser.get("/").status_code == 303


def test_login_refuses_wrong_and_trainer_tokens(browser: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    for token in ("", "ftp_admin_nope", make_job()["token"]):
        response = browser.post("/login", data={"token": token})
        assert response.status_code == 401
        assert "not valid here" in response.text
        assert "set-cookie" not in response.headers


def test_login_only_redirects_inside_the_site(browser: TestClient, admin_token: str) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "\\\\evil.example", "javascript:alert(1)"):
        response = browser.post("/login", data={"token": admin_token, "next": target})
        assert response.headers["location"] == "/fleet", target  # the root, which is the fleet to a cluster admin


def test_jobs_page_lists_status_and_restarts_by_rung(browser: TestClient, admin: TestClient, admin_token: str) -> None:
    job = job_with_restarts(admin)
    browser.headers.pop("Authorization", None)
    log_in(browser, admin_token)
    page = browser.get("/")
    assert page.status_code == 200
    for header, value in (
        ("content-security-policy", "script-src 'self'"),
        ("x-frame-options", "DENY"),
        ("cache-control", "no-store"),
    ):
        assert value in page.headers[header]
    html = page.text
    assert f'data-job-id="{job["id"]}"' in html and "llama-fsdp" in html and "RECOVERING" in html
    assert 'data-rung="inprocess_restart">1<' in html and 'data-rung="injob_restart">1<' in html
    assert 'data-rung="job_restart">0<' in html
    assert "/static/vendor/htmx.min.js" in html and 'hx-trigger="every 2s"' in html
    assert "cdn" not in html.lower()
    assert re.search(r'class="goodput-slot">\s*[0-9.]+ %', html)  # the job's ETTR
    rows = browser.get("/ui/jobs?status=RECOVERING")
    assert rows.status_code == 200 and job["id"] in rows.text
    assert job["id"] not in browser.get("/ui/jobs?status=SUCCEEDED").text


def test_job_page_shows_timeline_checkpoints_and_stale_ranks(
    browser: TestClient, admin: TestClient, admin_token: str
) -> None:
    job = job_with_restarts(admin)
    browser.headers.pop("Authorization", None)
    log_in(browser, admin_token)
    html = browser.get(f"/jobs/{job['id']}").text
    assert len(re.findall(r'class="mark mark-\w+_restart restart"', html)) == 2
    assert html.count('class="restart-rule"') == 2
    assert "rank 1: RuntimeError: injected exception" in html  # the cause, on hover and in the list
    assert html.count('class="rank stale"') == 1 and 'class="rank unseen"' in html
    assert "420 ms" in html and "3.5 s" in html and "700.0 MiB" in html  # checkpoint at step 100
    assert 'hx-get="/ui/jobs/' in html and 'hx-preserve="true"' in html
    live = browser.get(f"/ui/jobs/{job['id']}/live")
    assert live.status_code == 200 and "<html" not in live.text and "progress-data" in live.text
    assert browser.get("/jobs/nope").status_code == 404


def test_a_finished_job_stops_the_polling(
    browser: TestClient, admin: TestClient, admin_token: str, make_job: Callable[..., dict[str, Any]]
) -> None:
    job = make_job()
    admin.post(f"/v1/jobs/{job['id']}/cancel")
    browser.headers.pop("Authorization", None)
    log_in(browser, admin_token)
    assert browser.get(f"/ui/jobs/{job['id']}/live").status_code == 286  # htmx: stop polling
    assert "hx-trigger" not in browser.get(f"/jobs/{job['id']}").text.split('id="live"')[1].split(">")[0]


def test_goodput_slot_shows_the_ettr_and_the_lost_time(
    browser: TestClient, admin: TestClient, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.services import goodput

    def job_goodput(session: Any, job: Any) -> GoodputOut:
        lost = {name: 0.0 for name in LOST_BUCKETS} | {"restart": 15.0, "checkpoint_stall": 5.0}
        return goodput.empty(job).model_copy(
            update={"wall_s": 100.0, "productive_s": 80.0, "ettr": 0.8, "lost_s": lost}
        )

    monkeypatch.setattr(goodput, "job_goodput", job_goodput)
    job = job_with_restarts(admin)
    browser.headers.pop("Authorization", None)
    log_in(browser, admin_token)
    assert "80.0 %" in browser.get("/").text
    html = browser.get(f"/jobs/{job['id']}").text
    assert "ETTR <strong>80.0 %" in html
    assert html.count('class="seg ') == 3 and "restart: 15.0 s" in html and "checkpoint stall: 5.0 s" in html


def test_static_assets_are_vendored(browser: TestClient) -> None:
    for path in ("vendor/htmx.min.js", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css", "js/dashboard.js"):
        response = browser.get(f"/static/{path}")
        assert response.status_code == 200 and len(response.content) > 500, path


def test_auth_disabled_needs_no_login(monkeypatch: pytest.MonkeyPatch, browser: TestClient) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_AUTH", "disabled")
    get_settings.cache_clear()
    assert browser.get("/").status_code == 200


def test_a_queued_job_shows_its_wait_on_the_lifecycle_lane(
    browser: TestClient, admin: TestClient, admin_token: str, make_job: Callable[..., dict[str, Any]]
) -> None:
    """While Kueue holds the job suspended the backend records `queued`: the job page marks it on the lifecycle
    lane with the cause, as it does a submission or a run."""
    job = make_job()
    cause = "queued in LocalQueue team-a (Kueue has not admitted the workload)"
    queued = {"key": "k8s:queued:a0", "type": "queued", "details": {"cause": cause, "queue": "team-a"}}
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [queued]}).status_code == 200
    browser.headers.pop("Authorization", None)
    log_in(browser, admin_token)
    html = browser.get(f"/jobs/{job['id']}").text
    (mark,) = re.findall(r'<circle class="mark mark-queued"[^>]*><title>([^<]*)</title>', html)
    assert "team-a" in mark


def test_past_its_bounds_a_job_page_draws_the_ranks_and_nodes_that_need_attention(
    browser: TestClient,
    admin_token: str,
    make_job: Callable[..., dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job of 131,072 ranks would be 131,072 cells every 2 s: past the bounds (here 3 ranks and 2 nodes, for a
    job of 8 ranks on 4 nodes) the page draws the straggler, then the longest silent; counts say the rest."""
    from datetime import timedelta

    from api.core.db import session_scope
    from api.database.tables import JobWatch
    from api.models.liveness import write_ranks
    from api.models.nodes import write_nodes
    from api.schemas.events import utcnow
    from api.services import job_liveness_view

    monkeypatch.setattr(job_liveness_view, "RANK_CELLS_MAX", 3)
    monkeypatch.setattr(job_liveness_view, "NODE_ROWS_MAX", 2)
    job = make_job(
        nodes=4,
        procs_per_node=2,
        backend="kubernetes",
        image="r/t:1",
        checkpoint={"dir": "/c/t"},
        resiliency={"heartbeat_timeout_s": 90},
    )
    now = utcnow()
    silent_for = {4: 100.0, 5: 200.0, 6: 300.0}  # past the 90 s timeout; rank 7 never heard
    ranks = [
        {"job_id": job["id"], "rank": r, "attempt": 0, "node": f"n{r // 2}", "step": 9, "throughput": None}
        | {"last_seen": now - timedelta(seconds=silent_for.get(r, 1.0)), "loss": None, "step_time_s": 1.0}
        | {"compute_s": None, "perf_score": None}
        for r in range(7)
    ]
    healthy = {"attempt": 0, "last_seen": now, "launcher_alive": True, "progress": "sdk", "healthy": True}
    nodes = [
        {"job_id": job["id"], "node": f"n{n}", "unhealthy_reason": None, "ranks": [], "gpus": []} | healthy
        for n in range(4)
    ]
    nodes[1] |= {"launcher_alive": False}
    nodes[3] |= {"healthy": False, "unhealthy_reason": "Xid 79"}
    with session_scope() as session:
        write_ranks(session, ranks)
        write_nodes(session, nodes)
        session.add(JobWatch(job_id=job["id"], stragglers={"open": {"2": {}}}, open_stragglers=1, anomalies={}))
    log_in(browser, admin_token)
    html = browser.get(f"/ui/jobs/{job['id']}/live").text
    drawn = re.findall(r'<div class="rank (\w+)[^"]*" data-rank="(\d+)"', html)
    assert drawn == [("alive", "2"), ("stale", "5"), ("stale", "6")], drawn  # rank 4 and 7 past the bound
    summary = re.search(r'id="rank-summary">([^<]*)<', html)
    assert summary is not None and "8 ranks: 4 reporting, 3 stale, 1 never heard, 1 straggling" in summary.group(1)
    assert re.findall(r'<tr data-node="(\w+)">', html) == ["n1", "n3"] and 'id="node-summary">4 nodes' in html


def test_the_timeline_draws_one_marker_for_the_events_of_a_type_at_one_point() -> None:
    """A start of 16,384 nodes is 16,384 `running` at once: one marker says them all; another type, another point
    or a restart keeps its own."""
    from datetime import UTC, datetime, timedelta

    from api.database.tables import Event, Job
    from api.services.dashboard import timeline

    start = datetime(2026, 1, 1, tzinfo=UTC)
    job = Job(created_at=start, finished_at=start + timedelta(seconds=600))

    def event(kind: str, at_s: float, n: int) -> Event:
        at = start + timedelta(seconds=at_s)
        return Event(type=kind, ts=at, attempt=0, rank=n, node=f"n{n}", step=0, details={}, key=f"{kind}{n}")

    events = [event("running", 300, n) for n in range(5000)]
    events += [event("checkpoint_saved", 300, 0), event("running", 500, 0)]
    events += [event("injob_restart", 400, 0), event("injob_restart", 400, 1)]
    markers = timeline(job, sorted(events, key=lambda e: e.ts), start + timedelta(seconds=600)).markers
    drawn = [(m.type, m.more) for m in markers]
    assert drawn == [("running", 4999), ("checkpoint_saved", 0), ("injob_restart", 0), ("injob_restart", 0)] + [
        ("running", 0)
    ]
