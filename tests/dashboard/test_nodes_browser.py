"""The dashboard's nodes pages in real headless Chromium: a node lost under two jobs is listed quarantined, its page
says why, and its release form puts it back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.core.db import session_scope
from api.services.node_reputation import ledger
from tests.dashboard.test_browser import ARTIFACTS, CHROMIUM, LAUNCH_ARGS, require_chromium
from tests.support.live_api import serve_in_thread

pytestmark = pytest.mark.browser

NODE = "ip-10-0-4-2"


@pytest.fixture
def server(app: Any) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url


def quarantine(admin: TestClient, make_job: Any) -> list[str]:
    jobs = []
    for name in ("pretrain", "finetune"):
        job = make_job(name=name)
        lost = {"key": uuid.uuid4().hex, "type": "node_failed", "node": NODE, "attempt": 0}
        lost["details"] = {"cause": f"node {NODE} lost (NodeNotReady)", "cause_class": "node"}
        assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [lost]}).status_code == 200
        jobs.append(job["id"])
    healthy = {"key": uuid.uuid4().hex, "type": "checkpoint_saved", "node": "ip-10-0-4-3", "step": 5}
    assert admin.post(f"/v1/jobs/{jobs[0]}/events", json={"events": [healthy]}).status_code == 200
    with session_scope() as session:
        ledger.run_once(session)
    return jobs


def test_see_a_quarantined_node_and_release_it(server: str, admin: TestClient, admin_token: str, make_job: Any) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    quarantine(admin, make_job)
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(server + "/nodes")
            expect(page).to_have_url(server + "/login?next=/nodes")
            page.fill("#token", admin_token)
            page.click("button[type=submit]")
            expect(page).to_have_url(server + "/nodes")

            row = page.locator(f"tr.node[data-node='{NODE}']")
            expect(row).to_have_attribute("data-state", "quarantined")
            expect(row.locator(".fault[data-kind=lost]")).to_have_text("lost 2")
            expect(page.locator("tr.node[data-node='ip-10-0-4-3']")).to_have_attribute("data-state", "healthy")
            page.click("nav.filters a:text('quarantined')")
            expect(page.locator("tr.node")).to_have_count(1)
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard-nodes.png"))

            page.locator(f"tr.node[data-node='{NODE}'] a").first.click()
            expect(page).to_have_url(f"{server}/nodes/{NODE}")
            expect(page.locator("#node-state")).to_have_text("quarantined")
            expect(page.locator("#node-reason")).to_contain_text("2 job(s)")
            expect(page.locator("tr.fault-row[data-kind=lost]")).to_have_count(2)

            page.fill("#release-reason", "   ")  # only spaces: the API's refusal is shown, nothing changes
            page.click("#release-form button")
            expect(page.locator("#release-error")).to_contain_text("reason")
            problems.clear()  # the refused release answered 422, as it should
            page.fill("#release-reason", "PSU replaced")
            page.click("#release-form button")
            expect(page.locator("#node-state")).to_have_text("healthy")
            expect(page.locator("#node-history tr[data-action=released]").first).to_contain_text("PSU replaced")
        finally:
            browser.close()
    assert not problems, problems
    assert admin.get(f"/v1/nodes/{NODE}").json()["state"] == "healthy"


def test_the_pages_answer_without_a_browser(client: TestClient, admin: TestClient, make_job: Any) -> None:
    """The partial rows htmx polls, an unknown node's page, and a project viewer told which role the page needs."""
    quarantine(admin, make_job)
    rows = admin.get("/ui/nodes", params={"state": "quarantined"})
    assert rows.status_code == 200 and NODE in rows.text and "ip-10-0-4-3" not in rows.text
    assert admin.get("/nodes/no-such-node").status_code == 404
    assert admin.get("/nodes/Not_A_Name").status_code == 404
    viewer = admin.post("/v1/tokens", json={"name": "v", "project": "default", "role": "viewer"}).json()["token"]
    refused = TestClient(admin.app).get("/nodes", headers={"Authorization": f"Bearer {viewer}"})
    assert refused.status_code == 403 and "the cluster-admin role" in refused.text and NODE not in refused.text
