"""The dashboard in real headless Chromium: log in, see a job's restarts on its timeline, live updates."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.dashboard.scenario import job_with_restarts
from tests.support.live_api import serve_in_thread
from tests.webhooks.support import post_events

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
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
            expect(page.locator(".error")).to_contain_text("not a valid admin token")
            problems.clear()  # the refused login answered 401, as it should
            page.fill("#token", admin_token)
            page.click("button[type=submit]")
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
