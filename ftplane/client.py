"""A small HTTP client for the ftplane API (used by the CLI and the demo)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from api.core.config import get_settings

ADMIN_TOKEN_FILE = "admin-token"
RANKS_PAGE = 10_000  # ranks a request: a job may have 131,072


class ApiFailure(Exception):
    def __init__(self, status: int, message: str, body: Any = None):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.body = body


def default_url() -> str:
    return os.environ.get("FTPLANE_URL") or get_settings().resolved_public_url


def default_token() -> str | None:
    """FTPLANE_TOKEN, else the admin token `ftplane serve` saved for the embedded set-up."""
    if os.environ.get("FTPLANE_TOKEN"):
        return os.environ["FTPLANE_TOKEN"]
    path = Path(get_settings().data_dir) / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def failure_of(response: httpx.Response) -> ApiFailure:
    try:
        body = response.json()
        message = body.get("error", {}).get("message") or response.text
    except ValueError:
        body, message = None, response.text
    return ApiFailure(response.status_code, message, body)


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        token = token if token is not None else default_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=(url or default_url()).rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiFailure(0, f"cannot reach ftplane at {self.http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            raise failure_of(response)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    @contextmanager
    def logs(self, job_id: str, **params: Any) -> Iterator[httpx.Response]:
        """`GET /v1/jobs/{id}/logs` as NDJSON, streamed (a follow holds it open as long as lines come)."""
        timeout = httpx.Timeout(30.0, read=None if params.get("follow") else 30.0)
        headers = {"Accept": "application/x-ndjson"}
        try:
            with self.http.stream(
                "GET", f"/v1/jobs/{job_id}/logs", params=params, headers=headers, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise failure_of(response)
                yield response
        except httpx.TransportError as exc:
            raise ApiFailure(0, f"cannot reach ftplane at {self.http.base_url}: {exc}") from exc

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", "/v1/jobs", json=spec))

    def jobs(self, **params: Any) -> dict[str, Any]:
        return dict(self.request("GET", "/v1/jobs", params=params))

    def job(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/jobs/{job_id}"))

    def cancel(self, job_id: str) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/jobs/{job_id}/cancel"))

    def events(self, job_id: str, **params: Any) -> dict[str, Any]:
        return dict(self.request("GET", f"/v1/jobs/{job_id}/events", params=params))

    def all_events(self, job_id: str, **params: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = 0
        while True:
            page = self.events(job_id, cursor=cursor, limit=1000, **params)
            items.extend(page["items"])
            if not page["next_cursor"]:
                return items
            cursor = int(page["next_cursor"])

    def ranks(self, job_id: str) -> list[dict[str, Any]]:
        """Every rank's newest heartbeat, a page of RANKS_PAGE at a time."""
        ranks: list[dict[str, Any]] = []
        while True:
            params = {"after": ranks[-1]["rank"] if ranks else -1, "limit": RANKS_PAGE}
            page = list(self.request("GET", f"/v1/jobs/{job_id}/ranks", params=params))
            ranks.extend(page)
            if len(page) < RANKS_PAGE:
                return ranks

    def inject(self, job_id: str, fault: dict[str, Any]) -> dict[str, Any]:
        return dict(self.request("POST", f"/v1/jobs/{job_id}/faults", json=fault))
