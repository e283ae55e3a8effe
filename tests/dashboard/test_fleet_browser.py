"""The fleet page in real headless Chromium: ETTR over time with the lost time stacked by cause (uPlot, the job
page's charting library), the teams and jobs that lost the most, nodes by state, objectives with their budgets."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.dashboard.test_browser import ARTIFACTS, CHROMIUM, LAUNCH_ARGS, require_chromium, server  # noqa: F401
from tests.dashboard.test_fleet_page import fleet_of_two

pytestmark = pytest.mark.browser


def test_the_fleet_page_draws_the_fleet(
    server: str,  # noqa: F811 (the fixture)
    admin: TestClient,
    admin_token: str,
    make_job: Callable[..., dict[str, Any]],
) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    jobs = fleet_of_two(admin, make_job)
    admin.post("/v1/objectives", json={"name": "team-a", "selector": {"team": "a"}, "target": 0.9, "window": "1d"})
    admin.post("/v1/objectives", json={"name": "loose", "target": 0.1, "window": "1d"})
    from api.core.db import session_scope
    from workers.supervision import evaluate_objectives

    with session_scope() as session:
        evaluate_objectives.run_once(session)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(server + "/login")
            page.fill("#token", admin_token)
            page.click("button[type=submit]")
            expect(page).to_have_url(server + "/fleet")
            page.click("#fleet-windows a:has-text('last 1d')")
            expect(page).to_have_url(server + "/fleet?window=1d&by=team")

            expect(page.locator("#fleet-chart canvas")).to_have_count(1)  # uPlot drew
            # the day's hours, on the hour: 25 buckets (the first and last clipped), 24 when now is on the hour
            expect(page.locator("#fleet-chart")).to_have_attribute("data-buckets", re.compile("^2[45]$"))
            causes = page.locator("#fleet-chart").get_attribute("data-causes") or ""
            assert "restart" in causes.split(",") and "recompute" in causes.split(","), causes
            expect(page.locator("#fleet-chart .u-legend")).to_contain_text("ETTR")
            expect(page.locator("#fleet-teams tbody tr").first).to_have_attribute("data-team", "a")
            expect(page.locator("#fleet-jobs tbody tr").first).to_have_attribute("data-job-id", jobs["a"]["id"])
            expect(page.locator("#fleet-objectives tr.breached")).to_contain_text("team-a")
            expect(page.locator("#fleet-objectives tbody tr:not(.breached)")).to_contain_text("loose")
            expect(page.locator("#fleet-objectives svg.budget-bar rect.budget-left.spent")).to_have_count(1)
            nodes = page.locator("#fleet-nodes")
            expect(nodes).to_have_attribute("data-loaded", "nodes")  # GET /v1/nodes answered, with no node yet
            expect(nodes).to_contain_text("healthy")
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-fleet.png"), full_page=True)
            assert problems == [], problems  # no script errors, no Content-Security-Policy violations

            page.route("**/v1/nodes", lambda route: route.fulfill(status=404, body="{}"))
            page.reload()
            expect(nodes).to_have_attribute("data-loaded", "unavailable")
            expect(nodes).to_contain_text("Nodes are not available")
        finally:
            browser.close()
