"""A real OpenID Connect provider on loopback for the tests: keys made here, discovery and JWKS served over HTTP,
tokens signed with those keys (PyJWT), an authorization endpoint with a sign-in form, and a token endpoint that
redeems codes only with the PKCE verifier of their S256 challenge.

    with OidcIssuer(audience="ftplane", users={"alice": ["team-a"]}) as issuer:
        token = issuer.token("alice", groups=["team-a"])      # RS256, the current RSA key
        token = issuer.token("alice", alg="ES256")            # the current EC key
        issuer.rotate()                                       # new keys published, the old ones withdrawn
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm


@dataclass
class SigningKey:
    kid: str
    alg: str
    private: Any

    @classmethod
    def make(cls, alg: str) -> SigningKey:
        private: Any = (
            rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if alg == "RS256"
            else ec.generate_private_key(ec.SECP256R1())
        )
        return cls(kid=f"{alg.lower()}-{uuid.uuid4().hex[:8]}", alg=alg, private=private)

    def jwk(self) -> dict[str, Any]:
        algorithm = RSAAlgorithm if self.alg == "RS256" else ECAlgorithm
        public = algorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**public, "kid": self.kid, "alg": self.alg, "use": "sig"}


@dataclass
class Grant:
    client_id: str
    redirect_uri: str
    challenge: str
    user: str


@dataclass
class OidcIssuer:
    audience: str
    users: dict[str, list[str]] = field(default_factory=dict)  # who may sign in at /authorize, with their groups
    client_id: str = "ftplane-dashboard"
    client_secret: str | None = None
    keys: dict[str, SigningKey] = field(default_factory=dict)
    jwks_requests: int = 0
    token_requests: list[dict[str, str]] = field(default_factory=list)
    _grants: dict[str, Grant] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rotate()
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                issuer._get(self)

            def do_POST(self) -> None:  # noqa: N802
                issuer._post(self)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="oidc-issuer", daemon=True)

    def __enter__(self) -> OidcIssuer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # ---- keys and tokens ------------------------------------------------------------------------------

    def rotate(self) -> None:
        """Publish a new RSA and a new EC key, and withdraw the previous ones."""
        self.keys = {key.kid: key for key in (SigningKey.make("RS256"), SigningKey.make("ES256"))}

    def current(self, alg: str) -> SigningKey:
        return next(key for key in self.keys.values() if key.alg == alg)

    def token(
        self,
        subject: str,
        groups: list[str] | None = None,
        *,
        alg: str = "RS256",
        key: SigningKey | None = None,
        lifetime_s: float = 300,
        not_before_s: float = 0,
        **overrides: Any,
    ) -> str:
        key = key or self.current(alg)
        now = time.time()
        claims: dict[str, Any] = {
            "iss": self.url,
            "aud": self.audience,
            "sub": subject,
            "iat": int(now),
            "nbf": int(now + not_before_s),
            "exp": int(now + lifetime_s),
            "groups": groups or [],
        }
        claims.update(overrides)
        return jwt.encode(claims, key.private, algorithm=key.alg, headers={"kid": key.kid})

    # ---- HTTP -------------------------------------------------------------------------------------------

    def _send(self, handler: BaseHTTPRequestHandler, status: int, body: Any, *, content_type: str = "") -> None:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", content_type or "application/json")
        handler.send_header("Content-Length", str(len(raw)))
        handler.end_headers()
        handler.wfile.write(raw)

    def _redirect(self, handler: BaseHTTPRequestHandler, location: str) -> None:
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        if url.path == "/.well-known/openid-configuration":
            self._send(
                handler,
                200,
                {
                    "issuer": self.url,
                    "jwks_uri": f"{self.url}/jwks",
                    "authorization_endpoint": f"{self.url}/authorize",
                    "token_endpoint": f"{self.url}/token",
                    "response_types_supported": ["code"],
                    "id_token_signing_alg_values_supported": ["RS256", "ES256"],
                    "code_challenge_methods_supported": ["S256"],
                },
            )
        elif url.path == "/jwks":
            self.jwks_requests += 1
            self._send(handler, 200, {"keys": [key.jwk() for key in self.keys.values()]})
        elif url.path == "/authorize":
            self._sign_in_form(handler, {k: v[0] for k, v in parse_qs(url.query).items()})
        else:
            self._send(handler, 404, {"error": "not_found"})

    def _sign_in_form(self, handler: BaseHTTPRequestHandler, params: dict[str, str]) -> None:
        if params.get("response_type") != "code" or params.get("client_id") != self.client_id:
            self._send(handler, 400, {"error": "invalid_request"})
            return
        if params.get("code_challenge_method") != "S256" or not params.get("code_challenge"):
            self._send(handler, 400, {"error": "invalid_request", "error_description": "PKCE S256 required"})
            return
        hidden = "".join(
            f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">' for k, v in params.items()
        )
        page = (
            "<!doctype html><title>Sign in · test identity provider</title><h1>Sign in</h1>"
            f'<form method="post" action="/authorize">{hidden}'
            '<label for="username">User name</label><input id="username" name="username">'
            '<button type="submit">Sign in</button></form>'
        )
        self._send(handler, 200, page.encode(), content_type="text/html")

    def _post(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        form = {k: v[0] for k, v in parse_qs(handler.rfile.read(length).decode()).items()}
        if url.path == "/authorize":
            user = form.get("username", "")
            if user not in self.users:
                self._send(handler, 403, {"error": "access_denied"})
                return
            code = secrets.token_urlsafe(24)
            self._grants[code] = Grant(form["client_id"], form["redirect_uri"], form["code_challenge"], user)
            self._redirect(handler, f"{form['redirect_uri']}?{urlencode({'code': code, 'state': form['state']})}")
        elif url.path == "/token":
            self._redeem(handler, form)
        else:
            self._send(handler, 404, {"error": "not_found"})

    def _redeem(self, handler: BaseHTTPRequestHandler, form: dict[str, str]) -> None:
        self.token_requests.append(form)
        if self.client_secret is not None:
            expected = base64.b64encode(f"{self.client_id}:{self.client_secret}".encode()).decode()
            if handler.headers.get("Authorization") != f"Basic {expected}":
                self._send(handler, 401, {"error": "invalid_client"})
                return
        grant = self._grants.pop(form.get("code", ""), None)  # a code is redeemed once
        verifier = form.get("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
        if (
            form.get("grant_type") != "authorization_code"
            or grant is None
            or grant.redirect_uri != form.get("redirect_uri")
            or grant.client_id != form.get("client_id", self.client_id)
            or not secrets.compare_digest(challenge, grant.challenge)
        ):
            self._send(handler, 400, {"error": "invalid_grant"})
            return
        groups = self.users[grant.user]
        self._send(
            handler,
            200,
            {
                "access_token": self.token(grant.user, groups),
                "id_token": self.token(grant.user, groups, aud=self.client_id),
                "token_type": "Bearer",
                "expires_in": 300,
            },
        )
