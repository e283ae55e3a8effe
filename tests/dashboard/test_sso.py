"""The dashboard's sign-in through an OIDC provider (authorization code with PKCE), against a real issuer on
loopback (tests/support/oidc_issuer.py: its authorization endpoint shows a sign-in form, its token endpoint
redeems a code once, only with the verifier of its S256 challenge and the client's secret)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import tiny_spec
from tests.dashboard.test_browser import CHROMIUM, LAUNCH_ARGS, require_chromium
from tests.support.embedded_app import point_at
from tests.support.live_api import serve_in_thread
from tests.support.oidc_issuer import OidcIssuer

AUDIENCE = "ftplane-api"


@pytest.fixture
def issuer() -> Iterator[OidcIssuer]:
    with OidcIssuer(audience=AUDIENCE, users={"alice": ["cv"], "mallory": []}, client_secret="s3cret") as running:
        yield running


@pytest.fixture
def sso_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, issuer: OidcIssuer) -> Iterator[Any]:
    point_at(
        monkeypatch,
        tmp_path,
        FTPLANE_OIDC_ISSUER=issuer.url,
        FTPLANE_OIDC_AUDIENCE=AUDIENCE,
        FTPLANE_OIDC_CLIENT_ID=issuer.client_id,
        FTPLANE_OIDC_CLIENT_SECRET="s3cret",
    )
    from api.core import queue
    from api.core.db import reset_caches, session_scope
    from api.main import create_app
    from api.models import tokens

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)
    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "sso")
    app.state.admin_token = token
    yield app
    reset_caches()


def jobs_in_two_projects(app: Any) -> tuple[str, str]:
    """A job in `vision` (whose viewers are the group `cv`) and one in `default`."""
    admin = TestClient(app, headers={"Authorization": f"Bearer {app.state.admin_token}"})
    assert admin.post("/v1/projects", json={"name": "vision"}).status_code == 201
    assert admin.post("/v1/projects/vision/bindings", json={"group": "cv", "role": "viewer"}).status_code == 201
    seen = admin.post("/v1/jobs", json=tiny_spec(name="seen", project="vision")).json()["id"]
    hidden = admin.post("/v1/jobs", json=tiny_spec(name="hidden")).json()["id"]
    return seen, hidden


@pytest.mark.browser
def test_sign_in_through_the_provider_in_a_browser(sso_app: Any, issuer: OidcIssuer) -> None:
    require_chromium()
    from playwright.sync_api import expect, sync_playwright

    seen, hidden = jobs_in_two_projects(sso_app)
    problems: list[str] = []
    with serve_in_thread(sso_app) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=LAUNCH_ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{server}/jobs/{seen}")
            expect(page).to_have_url(f"{server}/login?next=/jobs/{seen}")
            expect(page.locator("#token")).to_be_visible()  # the token login stays, for machines
            page.click("a.sso")
            expect(page.locator("h1")).to_have_text("Sign in")  # the provider's own page
            assert page.url.startswith(f"{issuer.url}/authorize?")
            assert "code_challenge_method=S256" in page.url and "code_challenge=" in page.url
            page.fill("#username", "alice")
            page.click("button[type=submit]")
            expect(page).to_have_url(f"{server}/jobs/{seen}")  # back where the sign-in began
            expect(page.locator("body")).to_contain_text("seen")
            [cookie] = [c for c in page.context.cookies() if c["name"] == "ftplane_token"]
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            page.goto(f"{server}/")
            expect(page.locator(f"tr[data-job-id='{seen}']")).to_have_count(1)
            expect(page.locator(f"tr[data-job-id='{hidden}']")).to_have_count(0)  # no role in `default`
            answer = page.goto(f"{server}/jobs/{hidden}")
            assert answer is not None and answer.status == 404  # as for a job that does not exist
            assert problems == [], problems
        finally:
            browser.close()
    [redeemed] = issuer.token_requests
    assert redeemed["grant_type"] == "authorization_code" and len(redeemed["code_verifier"]) >= 43


def test_the_callback_refuses_a_forged_state_and_a_replayed_code(sso_app: Any, issuer: OidcIssuer) -> None:
    """Without a browser: the flow's cookie, the state check, the code redeemed once, the verifier checked."""
    from urllib.parse import parse_qs, urlsplit

    import httpx

    jobs_in_two_projects(sso_app)
    client = TestClient(sso_app, follow_redirects=False)
    start = client.get("/login/sso", params={"next": "/"})
    assert start.status_code == 303
    authorize = urlsplit(start.headers["location"])
    params = {k: v[0] for k, v in parse_qs(authorize.query).items()}
    assert params["code_challenge_method"] == "S256" and params["redirect_uri"].endswith("/login/sso/callback")
    signed_in = httpx.post(f"{issuer.url}/authorize", data={**params, "username": "alice"})
    code = parse_qs(urlsplit(signed_in.headers["location"]).query)["code"][0]

    forged = client.get("/login/sso/callback", params={"code": code, "state": "forged"})
    assert (
        forged.status_code == 400
        and "state" in forged.text
        and "ftplane_token" not in forged.headers.get("set-cookie", "")
    )
    done = client.get("/login/sso/callback", params={"code": code, "state": params["state"]})
    assert done.status_code == 200 and "ftplane_token=" in done.headers["set-cookie"], done.text
    session = TestClient(sso_app, cookies={"ftplane_token": client.cookies["ftplane_token"]})
    assert [p["name"] for p in session.get("/v1/projects").json()] == ["vision"]  # the API takes the cookie too
    replayed = client.get("/login/sso/callback", params={"code": code, "state": params["state"]})
    assert replayed.status_code == 400  # the flow's cookie went with its sign-in
    again = client.get("/login/sso", params={"next": "/"})
    state = parse_qs(urlsplit(again.headers["location"]).query)["state"][0]
    spent = client.get("/login/sso/callback", params={"code": code, "state": state})
    assert spent.status_code == 502 and "invalid_grant" in spent.text  # the provider redeems a code once
    stranger = TestClient(sso_app, follow_redirects=False)
    no_flow = stranger.get("/login/sso/callback", params={"code": code, "state": params["state"]})
    assert no_flow.status_code == 400 and "not started here" in no_flow.text
    refused = stranger.get("/login/sso/callback", params={"error": "access_denied"})
    assert refused.status_code == 401 and "access_denied" in refused.text
