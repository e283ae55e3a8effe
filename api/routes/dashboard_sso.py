"""The dashboard's sign-in through the organisation's OIDC provider: authorization code with PKCE (RFC 7636).

Offered when FTPLANE_OIDC_CLIENT_ID is set (beside the token login, kept for machines and the embedded
default). `/login/sso` sends the browser to the provider's authorization endpoint with a fresh `state` and
a S256 code challenge; the verifier and state wait in a short-lived HttpOnly cookie scoped to the callback.
`/login/sso/callback` checks the state, redeems the code with the verifier at the token endpoint, and
checks the access token as the API checks every bearer JWT (api/core/oidc.py): the dashboard's session
cookie then holds it, so pages and API calls from the browser are authorized by the same role bindings.
"""

from __future__ import annotations

import hmac
import json
import time
from html import escape
from typing import Any

import httpx
from authlib.common.security import generate_token
from authlib.common.urls import add_params_to_uri
from authlib.oauth2.rfc7636 import create_s256_code_challenge
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.core import oidc
from api.core.config import get_settings
from api.deps import SESSION_COOKIE
from api.routes.dashboard import COOKIE_MAX_AGE_S, SECURITY_HEADERS, _page, _safe_next, landing

router = APIRouter(include_in_schema=False)

FLOW_COOKIE = "ftplane_sso"
FLOW_PATH = "/login/sso"
FLOW_MAX_AGE_S = 600
TOKEN_TIMEOUT_S = 10.0


def sso_enabled() -> bool:
    settings = get_settings()
    return settings.oidc_enabled and settings.oidc_client_id is not None


def _failed(request: Request, message: str, status_code: int = 401) -> Response:
    return _page(request, "login.html", {"next": "/", "error": message, "sso": sso_enabled()}, status_code)


@router.get("/login/sso")
def sso_start(request: Request, next: str = "/") -> Response:
    verifier = oidc.verifier()
    settings = get_settings()
    if verifier is None or settings.oidc_client_id is None:
        return _failed(request, "Single sign-on is not configured here: log in with a token.", 404)
    try:
        provider = verifier.provider()
    except oidc.ProviderUnavailable:
        return _failed(request, "The identity provider cannot be reached now: try again shortly.", 503)
    if provider.authorization_endpoint is None:
        return _failed(request, "The identity provider publishes no authorization endpoint.", 503)
    state, code_verifier = generate_token(32), generate_token(64)
    target = add_params_to_uri(
        provider.authorization_endpoint,
        [
            ("response_type", "code"),
            ("client_id", settings.oidc_client_id),
            ("redirect_uri", str(request.url_for("sso_callback"))),
            ("scope", settings.oidc_scopes),
            ("state", state),
            ("code_challenge", create_s256_code_challenge(code_verifier)),
            ("code_challenge_method", "S256"),
        ],
    )
    response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    flow = json.dumps({"state": state, "verifier": code_verifier, "next": _safe_next(next)})
    # Lax: the provider's redirect back is a cross-site navigation, which a Strict cookie would not follow.
    response.set_cookie(
        FLOW_COOKIE,
        flow,
        max_age=FLOW_MAX_AGE_S,
        path=FLOW_PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


@router.get("/login/sso/callback", name="sso_callback")
def sso_callback(request: Request, code: str = "", state: str = "", error: str = "") -> Response:
    verifier = oidc.verifier()
    settings = get_settings()
    if verifier is None or settings.oidc_client_id is None:
        return _failed(request, "Single sign-on is not configured here: log in with a token.", 404)
    if error:
        return _failed(request, f"The identity provider refused the sign-in ({error[:100]}).")
    try:
        flow = json.loads(request.cookies.get(FLOW_COOKIE, ""))
        expected, code_verifier, next_ = str(flow["state"]), str(flow["verifier"]), _safe_next(flow.get("next"))
    except (ValueError, KeyError, TypeError):
        return _failed(request, "This sign-in was not started here (or took too long): start it again.", 400)
    if not code or not hmac.compare_digest(state.encode(), expected.encode()):
        return _failed(request, "The sign-in's state does not match: start it again.", 400)
    try:
        tokens = _redeem(verifier.provider(), code, code_verifier, str(request.url_for("sso_callback")))
        access_token = str(tokens["access_token"])
        claims = verifier.verify(access_token)
    except (oidc.ProviderUnavailable, httpx.HTTPError, KeyError, ValueError) as exc:
        return _failed(request, f"The sign-in could not be completed: {str(exc)[:200]}", 502)
    except oidc.InvalidJwt as exc:
        return _failed(request, f"The provider's access token is not one this API accepts: {exc}")
    admin_group = settings.oidc_cluster_admin_group
    next_ = landing(next_, admin_group is not None and admin_group in claims.groups)
    # The cookie is set on a page of this site that then moves on: a Strict cookie set in the answer to the
    # provider's cross-site redirect would not be sent with a redirect that follows it.
    body = (
        f'<!doctype html><meta http-equiv="refresh" content="0;url={escape(next_)}">'
        f'<title>Signed in · ftplane</title><p>Signed in. <a href="{escape(next_)}">Continue</a></p>'
    )
    response = HTMLResponse(body, headers=SECURITY_HEADERS)
    lifetime = int(min(COOKIE_MAX_AGE_S, max(1.0, claims.expires_at - time.time())))
    response.set_cookie(
        SESSION_COOKIE,
        access_token,
        max_age=lifetime,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.delete_cookie(FLOW_COOKIE, path=FLOW_PATH)
    return response


def _redeem(provider: oidc.Provider, code: str, code_verifier: str, redirect_uri: str) -> dict[str, Any]:
    """The token endpoint's answer to the code and its verifier (the client authenticates with its secret, if
    it has one: client_secret_basic)."""
    settings = get_settings()
    if provider.token_endpoint is None:
        raise oidc.ProviderUnavailable("the provider publishes no token endpoint")
    secret = settings.oidc_client_secret.get_secret_value() if settings.oidc_client_secret else None
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": redirect_uri,
        "code_verifier": code_verifier,
        "client_id": settings.oidc_client_id or "",
    }
    auth = (settings.oidc_client_id or "", secret) if secret else None
    response = httpx.post(provider.token_endpoint, data=form, auth=auth, timeout=TOKEN_TIMEOUT_S)
    if response.status_code != 200:
        raise ValueError(f"the token endpoint answered {response.status_code}: {response.text[:200]}")
    body = response.json()
    if not isinstance(body, dict):
        raise ValueError("the token endpoint's answer is not a JSON object")
    return body
