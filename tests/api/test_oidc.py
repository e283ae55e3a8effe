"""Bearer JWTs of a real OIDC provider on loopback (tests/support/oidc_issuer.py): keys made here, discovery and
JWKS served over HTTP, tokens signed with them; role bindings map groups and subjects to project roles."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from fastapi.testclient import TestClient

from tests.conftest import configure_env, tiny_spec
from tests.support.oidc_issuer import OidcIssuer, SigningKey
from tests.support.waiting import wait_for

AUDIENCE = "ftplane-api"


@pytest.fixture
def issuer() -> Iterator[OidcIssuer]:
    with OidcIssuer(audience=AUDIENCE) as running:
        yield running


@pytest.fixture
def oidc_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str, issuer: OidcIssuer) -> Iterator[Any]:
    configure_env(
        monkeypatch,
        tmp_path / "state",
        database_url,
        FTPLANE_OIDC_ISSUER=issuer.url,
        FTPLANE_OIDC_AUDIENCE=AUDIENCE,
        FTPLANE_OIDC_GROUPS_CLAIM="roles",
        FTPLANE_OIDC_CLUSTER_ADMIN_GROUP="platform",
        FTPLANE_OIDC_LEEWAY_S="5",
    )
    from api.core import queue
    from api.core.db import reset_caches
    from api.main import create_app

    monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)
    yield create_app()
    reset_caches()


def as_bearer(app: Any, token: str) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def root(app: Any, issuer: OidcIssuer) -> TestClient:
    return as_bearer(app, issuer.token("root", roles=["platform"]))


def test_groups_and_subjects_map_to_project_roles(oidc_app: Any, issuer: OidcIssuer) -> None:
    """The groups claim is the one configured (here `roles`); a subject binding and a group binding combine to
    the highest role; cluster admins come from the configured group."""
    admin = root(oidc_app, issuer)
    assert admin.post("/v1/projects", json={"name": "vision"}).status_code == 201
    assert admin.post("/v1/projects/vision/bindings", json={"group": "cv", "role": "viewer"}).status_code == 201
    assert admin.post("/v1/projects/vision/bindings", json={"subject": "ana", "role": "operator"}).status_code == 201

    viewer = as_bearer(oidc_app, issuer.token("bob", roles=["cv"]))
    refused = viewer.post("/v1/jobs", json=tiny_spec(project="vision"))
    assert refused.status_code == 403 and "the operator role in project 'vision'" in refused.json()["error"]["message"]
    operator = as_bearer(oidc_app, issuer.token("ana", roles=["cv"], alg="ES256"))
    job = operator.post("/v1/jobs", json=tiny_spec(project="vision"))
    assert job.status_code == 201, job.text
    assert viewer.get(f"/v1/jobs/{job.json()['id']}").status_code == 200
    outsider = as_bearer(oidc_app, issuer.token("eve", roles=["other"]))
    assert outsider.get(f"/v1/jobs/{job.json()['id']}").status_code == 404
    assert outsider.get("/v1/jobs").json()["items"] == []
    # A groups claim under another name gives nothing: only the configured claim is read.
    groups_elsewhere = as_bearer(oidc_app, issuer.token("carl", groups=["cv"]))
    assert groups_elsewhere.get(f"/v1/jobs/{job.json()['id']}").status_code == 404

    entries = admin.get("/v1/audit", params={"actor": "ana"}).json()["items"]
    assert [(e["action"], e["issuer"], e["actor_kind"], e["outcome"]) for e in entries] == [
        ("POST /v1/jobs", issuer.url, "jwt", 201)
    ]


def _part(data: dict[str, Any] | bytes) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _unsigned(claims: dict[str, Any], header: dict[str, Any]) -> str:
    return f"{_part(header)}.{_part(claims)}."


def _hs256(claims: dict[str, Any], header: dict[str, Any], secret: bytes) -> str:
    """The algorithm-confusion attack: HMAC keyed with the provider's public key (PyJWT will not sign so)."""
    signed = f"{_part(header)}.{_part(claims)}"
    return f"{signed}.{_part(hmac.new(secret, signed.encode(), hashlib.sha256).digest())}"


def test_refused_jwts_are_401(oidc_app: Any, issuer: OidcIssuer) -> None:
    admin = root(oidc_app, issuer)
    assert admin.get("/v1/jobs").status_code == 200
    now = int(time.time())
    good = {"iss": issuer.url, "aud": AUDIENCE, "sub": "root", "roles": ["platform"], "exp": now + 300}
    rsa_key = issuer.current("RS256")
    stranger = SigningKey.make("RS256")
    stranger.kid = rsa_key.kid  # the provider's key id, someone else's key
    public_pem = rsa_key.private.public_key().public_bytes(
        encoding=serialization.Encoding.PEM, format=serialization.PublicFormat.SubjectPublicKeyInfo
    )
    cases = {
        "alg none": (_unsigned(good, {"alg": "none", "typ": "JWT", "kid": rsa_key.kid}), "algorithm 'none'"),
        "HS256 keyed with the public key": (
            _hs256(good, {"alg": "HS256", "typ": "JWT", "kid": rsa_key.kid}, public_pem),
            "algorithm 'HS256'",
        ),
        "unknown kid": (issuer.token("root", roles=["platform"], key=SigningKey.make("RS256")), "key id"),
        "another key under the provider's kid": (issuer.token("root", roles=["platform"], key=stranger), "Signature"),
        "wrong issuer": (issuer.token("root", roles=["platform"], iss="https://evil.example"), "issuer"),
        "wrong audience": (issuer.token("root", roles=["platform"], aud="someone-else"), "audience"),
        "expired": (issuer.token("root", roles=["platform"], lifetime_s=-60), "expired"),
        "not yet valid": (issuer.token("root", roles=["platform"], not_before_s=120), "not yet valid"),
        "no subject": (issuer.token("root", roles=["platform"], sub=None), "sub"),
    }
    for name, (token, said) in cases.items():
        answer = as_bearer(oidc_app, token).get("/v1/jobs")
        assert answer.status_code == 401, (name, answer.status_code, answer.text)
        assert said.lower() in answer.json()["error"]["message"].lower(), (name, answer.text)
        assert answer.headers["www-authenticate"] == "Bearer"
    # Within the leeway (5 s here) a just-expired or almost-valid token passes.
    assert (
        as_bearer(oidc_app, issuer.token("root", roles=["platform"], lifetime_s=-2)).get("/v1/jobs").status_code == 200
    )
    nearly = issuer.token("root", roles=["platform"], not_before_s=2)
    assert as_bearer(oidc_app, nearly).get("/v1/jobs").status_code == 200


def test_keys_are_cached_and_a_rotation_is_picked_up(oidc_app: Any, issuer: OidcIssuer) -> None:
    """Verifying costs no round trip once the keys are fetched; a token signed with a key published after a
    rotation fetches them again (once), and the withdrawn keys are refused from then on."""
    from api.core import oidc

    admin = root(oidc_app, issuer)
    for _ in range(20):
        assert admin.get("/v1/jobs").status_code == 200
    assert issuer.jwks_requests == 1
    old = issuer.current("ES256")
    before = issuer.token("root", roles=["platform"], key=old)

    issuer.rotate()
    verifier = oidc.verifier()
    assert verifier is not None
    verifier.key_refresh = 0  # (FTPLANE_OIDC_KEY_REFRESH_S: a new key id fetches at most this often)
    rotated = as_bearer(oidc_app, issuer.token("root", roles=["platform"], alg="ES256"))
    for _ in range(10):
        assert rotated.get("/v1/jobs").status_code == 200
    assert issuer.jwks_requests == 2
    withdrawn = as_bearer(oidc_app, before).get("/v1/jobs")
    assert withdrawn.status_code == 401 and old.kid in withdrawn.json()["error"]["message"]


def test_made_up_key_ids_fetch_the_keys_at_most_once_per_refresh_interval(oidc_app: Any, issuer: OidcIssuer) -> None:
    admin = root(oidc_app, issuer)
    assert admin.get("/v1/jobs").status_code == 200
    for _ in range(10):
        token = issuer.token("root", roles=["platform"], key=SigningKey.make("ES256"))
        assert as_bearer(oidc_app, token).get("/v1/jobs").status_code == 401
    assert issuer.jwks_requests == 1  # FTPLANE_OIDC_KEY_REFRESH_S (30 s) has not passed since the first fetch


def test_the_report_path_takes_an_operators_jwt_and_caches_it_no_longer_than_it_lives(
    oidc_app: Any, issuer: OidcIssuer
) -> None:
    admin = root(oidc_app, issuer)
    job = admin.post("/v1/jobs", json=tiny_spec()).json()
    assert admin.post("/v1/projects/default/bindings", json={"group": "ops", "role": "operator"}).status_code == 201
    assert admin.post("/v1/projects/default/bindings", json={"group": "watch", "role": "viewer"}).status_code == 201
    report = {"attempt": 0, "node": "n0", "heartbeats": [{"rank": 0, "step": 3}]}
    operator = as_bearer(oidc_app, issuer.token("op", roles=["ops"], lifetime_s=-2))  # within the 5 s leeway
    assert operator.post(f"/v1/jobs/{job['id']}/reports", json=report).status_code == 200
    viewer = as_bearer(oidc_app, issuer.token("v", roles=["watch"]))
    refused = viewer.post(f"/v1/jobs/{job['id']}/reports", json=report)
    assert refused.status_code == 403 and "operator" in refused.json()["error"]["message"]
    # Past its leeway (3 s from now) the token is refused, though the report path caches principals for 5 s.
    wait_for(
        "the expired JWT refused on the report path",
        lambda: operator.post(f"/v1/jobs/{job['id']}/reports", json=report).status_code == 401,
        timeout=15,
    )


def test_an_unreachable_provider_is_503_not_401(oidc_app: Any, issuer: OidcIssuer) -> None:
    token = issuer.token("root", roles=["platform"])
    issuer.__exit__(None, None, None)
    answer = as_bearer(oidc_app, token).get("/v1/jobs")
    assert answer.status_code == 503 and answer.headers["retry-after"], answer.text


def test_settings_refuse_an_issuer_over_plain_http_off_loopback() -> None:
    from pydantic import ValidationError

    from api.core.config import Settings

    with pytest.raises(ValidationError, match="https"):
        Settings(oidc_issuer="http://idp.example.com", oidc_audience="x")
    with pytest.raises(ValidationError, match="AUDIENCE"):
        Settings(oidc_issuer="https://idp.example.com")
    assert Settings(oidc_issuer="http://127.0.0.1:9000", oidc_audience="x").oidc_enabled
