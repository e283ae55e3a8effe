"""The dashboard in real headless Chromium: log in, see a job's restarts on its timeline, live updates, its logs."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.events import utcnow
from tests.dashboard.scenario import job_with_restarts
from tests.support.embedded_app import post_events
from tests.support.live_api import serve_in_thread
from tests.support.node_logs import node_logs
from tests.support.paths import REPO

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "tests" / "artifacts"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def require_chromium() -> None:
    if not os.path.exists(CHROMIUM):
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is missing: CI must run the browser tests (bash .ci/system-deps)")
        pytest.skip("chromium is not installed (bash .ci/system-deps installs it)")


@pytest.fixture
def server(app: Any) -> Iterator[str]:
    """The app on a real port, for the browser."""
    with serve_in_thread(app) as url:
        yield url


def test_log_in_and_see_a_restart_on_the_timeline(server: str, admin: TestClient, admin_token: str) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    job = job_with_restarts(admin)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))

            page.goto(server + "/")
            expect(page).to_have_url(server + "/login?next=/")
            page.fill("#token", "ftp_admin_wrong")
            page.click("button[type=submit]")
            expect(page.locator(".error")).to_contain_text("not valid here")
            problems.clear()  # the refused login answered 401, as it should
            page.fill("#token", admin_token)
            page.click("button[type=submit]")
            expect(page).to_have_url(server + "/fleet")  # a cluster admin lands on the fleet page
            page.click("header nav a[href='/']")
            expect(page).to_have_url(server + "/")

            [cookie] = [c for c in page.context.cookies() if c["name"] == "ftplane_token"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert page.evaluate("document.cookie") == ""  # not readable by scripts

            row = page.locator(f"tr[data-job-id='{job['id']}']")
            expect(row.locator("td[data-rung=inprocess_restart]")).to_have_text("1")
            expect(row.locator("td[data-rung=injob_restart]")).to_have_text("1")
            expect(row.locator(".status")).to_have_text("RECOVERING")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-jobs.png"))

            row.locator("a").click()
            expect(page).to_have_url(f"{server}/jobs/{job['id']}")
            expect(page.locator("#timeline circle.mark.restart")).to_have_count(2)
            expect(page.locator("#timeline line.restart-rule")).to_have_count(2)
            expect(page.locator("#progress-chart canvas")).to_have_count(1)  # uPlot drew
            expect(page.locator("#progress-chart")).to_have_attribute("data-restarts", "2")
            expect(page.locator("#checkpoints tbody tr")).to_have_count(2)
            expect(page.locator("#checkpoints")).to_contain_text("700.0 MiB")
            expect(page.locator(".rank.stale")).to_have_count(1)
            expect(page.locator(".rank.stale")).to_have_attribute("data-rank", "2")
            expect(page.locator(".rank.alive")).to_have_count(2)
            expect(page.locator(".rank.unseen")).to_have_count(1)

            # Live: a job-level restart reported now shows up without a reload (htmx polls every 2 s).
            post_events(admin, job, {"key": "r3", "type": "job_restart", "details": {"cause": "node lost"}})
            expect(page.locator("#timeline circle.mark.restart")).to_have_count(3, timeout=8000)
            expect(page.locator("#progress-chart")).to_have_attribute("data-restarts", "3", timeout=8000)
            expect(page.locator("dd[data-rung=job_restart]")).to_have_text("1")

            page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)
            assert problems == [], problems  # no script errors, no Content-Security-Policy violations

            page.click("header form.logout button")
            expect(page).to_have_url(server + "/login")
            page.goto(server + f"/jobs/{job['id']}")
            expect(page).to_have_url(f"{server}/login?next=/jobs/{job['id']}")
        finally:
            browser.close()


def test_the_logs_panel_follows_the_ranks_and_a_failure_links_to_its_lines(
    server: str, admin: TestClient, admin_token: str
) -> None:
    """A running job's page shows what its ranks printed and keeps following; a rank failure on the timeline and in
    the events table opens that rank's lines around it."""
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    job = job_with_restarts(admin)
    logs, _ = node_logs(job["id"])
    for n in range(3):
        logs.rank_line(0, f"rank 0 step {n}")
    logs.rank_line(1, "rank 1 step 0")
    logs.rank_line(1, "Traceback (most recent call last):")
    logs.rank_line(1, "ValueError: the failure's own line")
    failed = {"key": "rf1", "type": "rank_failed", "rank": 1, "node": "host-n0", "ts": utcnow().isoformat()}
    failed["details"] = {"cause": "raised ValueError: the failure's own line (exit code 1)", "cause_class": "exception"}
    restart = {"key": "jr1", "type": "job_restart", "attempt": 1, "ts": utcnow().isoformat()}
    restart["details"] = {**failed["details"], "rank": 1, "from_attempt": 0, "tail": "step 9\nValueError: the tail"}
    post_events(admin, job, failed, restart)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            host = server.split("//")[1].split(":")[0]
            context.add_cookies([{"name": "ftplane_token", "value": admin_token, "domain": host, "path": "/"}])
            page = context.new_page()
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{server}/jobs/{job['id']}")

            expect(page.locator("#failure-tail pre")).to_have_text("step 9\nValueError: the tail")
            page.locator("#log-controls select[name=attempt]").select_option("0")  # the job restart made attempt 1
            page.locator("#log-controls button").click()
            lines = page.locator("#log-lines .log-line")
            expect(lines).to_have_count(6)  # every rank's
            expect(page.locator("#log-lines")).to_have_attribute("data-state", "following")
            logs.rank_line(0, "printed while the page was open")
            expect(lines.last).to_contain_text("[rank0] printed while the page was open", timeout=8000)

            page.locator("#events tr.event-rank_failed a.logs-link").click()
            expect(page).to_have_url(f"{server}/jobs/{job['id']}?rank=1&attempt=0&around=" + _around(failed) + "#logs")
            expect(lines).to_have_count(3)
            expect(lines.last).to_have_text(re.compile(r"\[rank1\] ValueError: the failure's own line$"))
            expect(page.locator("#log-lines .near-failure")).to_have_count(3)
            page.screenshot(path=str(ARTIFACTS / "dashboard-logs.png"), full_page=True)

            page.goto(f"{server}/jobs/{job['id']}")
            page.locator("#timeline a.logs-link circle.mark-rank_failed").click()
            expect(page.locator("#log-controls input[name=rank]")).to_have_value("1")
            expect(lines.last).to_contain_text("ValueError: the failure's own line")
            assert problems == [], problems
        finally:
            browser.close()


def _around(event: dict[str, Any]) -> str:
    from urllib.parse import quote

    return quote(datetime.fromisoformat(event["ts"]).isoformat(), safe="")
