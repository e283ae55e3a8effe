"""Bearer JWTs from the organisation's OpenID Connect provider: discovery, keys, and verification (PyJWT).

A JWT is accepted when its signature verifies against a key of the provider's JWKS (RS256 or ES256; the
key id in its header names the key), its `iss` is the configured issuer and its `aud` the configured
audience, and `exp`/`nbf`/`iat` hold within FTPLANE_OIDC_LEEWAY_S. Anything else (`alg: none`, another
algorithm, a key id the provider does not publish, a wrong issuer or audience, an expired token) is
`InvalidJwt`, which the API answers with 401.

The discovery document and the keys are fetched once and kept: verifying costs no round trip to the
provider. The keys are fetched again after FTPLANE_OIDC_KEYS_TTL_S, and when a JWT names a key id that is
not among them (the provider rotated its keys), at most once per FTPLANE_OIDC_KEY_REFRESH_S.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import httpx
import jwt

from api.core.config import Settings, get_settings

ALGORITHMS = ("RS256", "ES256")
KEY_TYPES = {"RS256": "RSA", "ES256": "EC"}
FETCH_TIMEOUT_S = 5.0


class InvalidJwt(Exception):
    """Not a JWT this API accepts; the message says why (it is shown to the caller)."""


class ProviderUnavailable(Exception):
    """The provider's discovery document or keys could not be fetched."""


def looks_like_jwt(token: str) -> bool:
    """Three base64url parts, the first a JSON object: tokens this API makes never look so."""
    return token.startswith("eyJ") and token.count(".") == 2


@dataclass(frozen=True)
class Claims:
    subject: str
    issuer: str
    groups: tuple[str, ...]
    expires_at: float
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Provider:
    """What discovery says about the provider."""

    issuer: str
    jwks_uri: str
    authorization_endpoint: str | None
    token_endpoint: str | None


class OidcVerifier:
    def __init__(self, settings: Settings, http: httpx.Client | None = None) -> None:
        assert settings.oidc_issuer is not None and settings.oidc_audience is not None
        self.issuer = settings.oidc_issuer
        self.audience = settings.oidc_audience
        self.groups_claim = settings.oidc_groups_claim
        self.leeway = settings.oidc_leeway_s
        self.keys_ttl = settings.oidc_keys_ttl_s
        self.key_refresh = settings.oidc_key_refresh_s
        self._http = http or httpx.Client(timeout=FETCH_TIMEOUT_S, follow_redirects=False)
        self._lock = threading.Lock()
        self._provider: Provider | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = float("-inf")
        self.fetches = 0  # key fetches so far (read by tests and the benchmark)

    # ---- the provider ------------------------------------------------------------------------------

    def provider(self) -> Provider:
        with self._lock:
            if self._provider is None:
                self._provider = self._discover()
            return self._provider

    def _discover(self) -> Provider:
        url = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
        document = self._get_json(url)
        if document.get("issuer") != self.issuer:
            raise ProviderUnavailable(f"{url} names issuer {document.get('issuer')!r}, not {self.issuer!r}")
        if not isinstance(document.get("jwks_uri"), str):
            raise ProviderUnavailable(f"{url} has no jwks_uri")
        return Provider(
            issuer=self.issuer,
            jwks_uri=document["jwks_uri"],
            authorization_endpoint=document.get("authorization_endpoint"),
            token_endpoint=document.get("token_endpoint"),
        )

    def _get_json(self, url: str) -> dict[str, Any]:
        try:
            response = self._http.get(url)
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise ProviderUnavailable(f"cannot read {url}: {exc}") from exc
        if not isinstance(body, dict):
            raise ProviderUnavailable(f"{url} is not a JSON object")
        return body

    def _key(self, kid: str) -> jwt.PyJWK | None:
        """The key with this id, fetching the keys when they are old, or when the id is new and the last fetch
        is older than the refresh interval."""
        with self._lock:
            now = time.monotonic()
            age = now - self._fetched_at
            stale = age > self.keys_ttl
            unknown = kid not in self._keys and age >= self.key_refresh
            if stale or unknown:
                self._fetch_keys(now)
            return self._keys.get(kid)

    def _fetch_keys(self, now: float) -> None:
        if self._provider is None:
            self._provider = self._discover()
        document = self._get_json(self._provider.jwks_uri)
        self.fetches += 1
        keys: dict[str, jwt.PyJWK] = {}
        for entry in document.get("keys", []):
            if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str):
                continue
            if entry.get("use", "sig") != "sig":
                continue
            try:
                keys[entry["kid"]] = jwt.PyJWK.from_dict(entry)
            except jwt.PyJWTError:
                continue  # a key of a type or curve this API does not verify with
        self._keys = keys
        self._fetched_at = now

    # ---- verification ------------------------------------------------------------------------------

    def verify(self, token: str) -> Claims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidJwt(f"not a readable JWT: {exc}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise InvalidJwt(f"JWT algorithm {alg!r} is not accepted (only {', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise InvalidJwt("the JWT's header names no key id (kid)")
        key = self._key(kid)
        if key is None:
            raise InvalidJwt(f"the JWT's key id {kid!r} is not one of the provider's keys")
        if key.key_type != KEY_TYPES[alg]:
            raise InvalidJwt(f"key {kid!r} is a {key.key_type} key; the JWT says {alg}")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[alg],
                audience=self.audience,
                issuer=self.issuer,
                leeway=self.leeway,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError as exc:
            raise InvalidJwt(f"JWT refused: {exc}") from None
        groups = claims.get(self.groups_claim) or []
        if isinstance(groups, str):
            groups = [groups]
        return Claims(
            subject=str(claims["sub"]),
            issuer=str(claims["iss"]),
            groups=tuple(g for g in groups if isinstance(g, str)),
            expires_at=float(claims["exp"]),
            raw=claims,
        )


@lru_cache
def verifier() -> OidcVerifier | None:
    """The process's verifier, keeping the provider's keys; None when no provider is configured."""
    settings = get_settings()
    return OidcVerifier(settings) if settings.oidc_enabled else None
