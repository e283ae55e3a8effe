"""The fleet page without a browser: a cluster admin lands on it after logging in; it shows the teams and jobs that
lost the most, and the objectives; a project's admin sees their projects' jobs only; a viewer is told what it needs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi.testclient import TestClient

from tests.api.test_fleet_goodput import history, launched_job, post, summarize


def fleet_of_two(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> dict[str, dict[str, Any]]:
    jobs = {
        "a": launched_job(admin, make_job, name="crashy", labels={"team": "a"}),
        "b": launched_job(admin, make_job, name="calm", labels={"team": "b"}),
    }
    post(admin, jobs["a"], history(crash=True))
    post(admin, jobs["b"], history(crash=False))
    summarize()
    return jobs


def test_a_cluster_admin_lands_on_the_fleet(
    client: TestClient, admin: TestClient, admin_token: str, make_job: Callable[..., dict[str, Any]]
) -> None:
    jobs = fleet_of_two(admin, make_job)
    admin.post("/v1/objectives", json={"name": "team-a", "selector": {"team": "a"}, "target": 0.9, "window": "1d"})
    browser = TestClient(client.app, follow_redirects=False)
    response = browser.post("/login", data={"token": admin_token, "next": "/"})
    assert response.status_code == 303 and response.headers["location"] == "/fleet"
    page = browser.get("/fleet")
    assert page.status_code == 200
    html = page.text
    teams = html[html.index('id="fleet-teams"') :]
    assert teams.index('data-team="a"') < teams.index('data-team="b"')  # team a lost more
    assert (
        f'data-job-id="{jobs["a"]["id"]}"' in html and "team-a" in html and "breached" not in html.split("<tbody>")[0]
    )
    assert 'id="fleet-chart"' in html and 'data-src="/v1/nodes"' in html and "restart" in html
    assert browser.get("/fleet?window=1d&by=team").status_code == 200
    assert browser.get("/fleet?window=bogus&by=%3Cscript%3E").status_code == 200  # a page falls back, never 422s
    assert 'href="/fleet"' in browser.get("/").text  # in the navigation


def test_a_project_admin_sees_their_jobs_and_a_viewer_what_it_needs(
    client: TestClient, admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    jobs = fleet_of_two(admin, make_job)
    assert admin.post("/v1/projects", json={"name": "p-one"}).status_code == 201
    mine = launched_job(admin, make_job, name="mine", project="p-one", labels={"team": "p1"})
    post(admin, mine, history(crash=True))
    summarize()
    made = admin.post("/v1/tokens", json={"name": "p1-admin", "project": "p-one", "role": "admin"}).json()
    viewer = admin.post("/v1/tokens", json={"name": "p1-viewer", "project": "p-one", "role": "viewer"}).json()
    as_admin = TestClient(client.app, cookies={"ftplane_token": made["token"]}).get("/fleet").text
    assert mine["id"] in as_admin and jobs["a"]["id"] not in as_admin and jobs["b"]["id"] not in as_admin
    as_viewer = TestClient(client.app, cookies={"ftplane_token": viewer["token"]}).get("/fleet")
    assert (
        as_viewer.status_code == 200 and "needs the admin role" in as_viewer.text and mine["id"] not in as_viewer.text
    )
