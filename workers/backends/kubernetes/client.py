"""The Kubernetes API as the backend calls it: a client loaded on first use, and every call retried within bounds.

Transient API errors (429, 5xx, timeouts, a dropped connection) are retried with
exponential backoff and jitter, within a number of tries and a deadline
(`RetryPolicy`); a 429's Retry-After is honoured, capped. A create that meets 409
and a delete that meets 404 are done. Whatever still fails is raised as
`KubernetesBackendError`, with what to do about it and whether trying later may help.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt, stop_after_delay

from api.core.config import Settings, get_settings
from api.core.kube import KubeConfigError, load_api_client

log = logging.getLogger(__name__)
T = TypeVar("T")

TRANSIENT_STATUSES = frozenset({0, 408, 429, 500, 502, 503, 504})


class KubernetesBackendError(RuntimeError):
    """The Kubernetes API refused or kept failing a call; `retryable` when trying later may help."""

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return (exc.status or 0) in TRANSIENT_STATUSES
    return isinstance(exc, urllib3.exceptions.HTTPError | OSError)


def status_of(exc: BaseException) -> int | None:
    return exc.status if isinstance(exc, ApiException) else None


def api_message(exc: BaseException) -> str:
    """What the API (or the connection) said, in one line."""
    if isinstance(exc, ApiException):
        try:
            body = json.loads(exc.body or "{}")
            text = body.get("message") or exc.reason
        except (ValueError, AttributeError):
            text = exc.reason
        return f"HTTP {exc.status}: {text}"
    return f"{type(exc).__name__}: {exc}"


def backend_error(what: str, exc: BaseException) -> KubernetesBackendError:
    """The error to raise for a failed call, with advice for the status the API answered."""
    status = status_of(exc)
    hint = {
        401: "the worker's Kubernetes credentials were refused; check its ServiceAccount or kubeconfig",
        403: "the worker's ServiceAccount lacks a permission; apply the deploy/ RBAC in this namespace",
        404: "the namespace may not exist; create it or change the spec's namespace",
        422: "Kubernetes rejected the object; check the spec's image, resources and labels",
    }.get(status or -1, "the Kubernetes API is unavailable; the call can be retried later")
    return KubernetesBackendError(
        f"kubernetes {what} failed ({api_message(exc)}): {hint}",
        retryable=is_transient(exc),
        status=status,
    )


@contextmanager
def failure_of(what: str) -> Iterator[None]:
    """Any error inside the block is raised as a `KubernetesBackendError` about `what`."""
    try:
        yield
    except Exception as exc:
        raise backend_error(what, exc) from exc


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries of transient API errors: attempts, exponential backoff (with jitter), a deadline."""

    attempts: int = 5
    base_wait_s: float = 0.5
    max_wait_s: float = 8.0
    deadline_s: float = 45.0

    def wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ApiException) and exc.status == 429 and exc.headers:
            try:  # the API server's Retry-After, capped
                return min(float(exc.headers.get("Retry-After", "")), self.max_wait_s)
            except ValueError:
                pass
        backoff = min(self.max_wait_s, self.base_wait_s * 2.0 ** (state.attempt_number - 1))
        return backoff * (0.5 + random.random() / 2)


class KubernetesApi:
    """The API calls the backend makes: reads as plain dicts, idempotent creates and deletes, bounded retries."""

    def __init__(
        self,
        api_client: k8s_client.ApiClient | None = None,
        *,
        settings: Settings | None = None,
        request_timeout: tuple[float, float] = (5.0, 30.0),
        retry: RetryPolicy | None = None,
    ) -> None:
        self._api = api_client
        self._settings = settings
        self._lock = threading.Lock()
        self.request_timeout = request_timeout
        self.retry = retry or RetryPolicy()

    @property
    def api_client(self) -> k8s_client.ApiClient:
        """The API client, built on first use (rendering needs no cluster)."""
        if self._api is None:
            with self._lock:
                if self._api is None:
                    self._api = self._load_client()
        return self._api

    def _load_client(self) -> k8s_client.ApiClient:
        try:
            return load_api_client(self._settings or get_settings())
        except KubeConfigError as exc:
            raise KubernetesBackendError(str(exc), retryable=False) from exc

    @property
    def core(self) -> Any:
        return k8s_client.CoreV1Api(self.api_client)

    @property
    def batch(self) -> Any:
        return k8s_client.BatchV1Api(self.api_client)

    @property
    def custom(self) -> Any:
        return k8s_client.CustomObjectsApi(self.api_client)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """One API call with bounded retries of transient errors; other errors propagate unchanged."""
        kwargs.setdefault("_request_timeout", self.request_timeout)

        def log_retry(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("kubernetes %s failed (try %d): %s; retrying", what, state.attempt_number, exc)

        retrying = Retrying(
            retry=retry_if_exception(is_transient),
            stop=stop_after_attempt(self.retry.attempts) | stop_after_delay(self.retry.deadline_s),
            wait=self.retry.wait,
            before_sleep=log_retry,
            reraise=True,
        )
        return retrying(fn, *args, **kwargs)

    def read(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """A GET whose JSON body is returned as a plain dict (no model round-trip)."""

        def get(**options: Any) -> dict[str, Any]:
            resp = fn(*args, _preload_content=False, **kwargs, **options)
            try:
                data: dict[str, Any] = json.loads(resp.data or b"{}")
                return data
            finally:
                resp.release_conn()

        return self.call(what, get)

    def create(self, what: str, fn: Callable[..., Any], namespace: str, body: dict[str, Any]) -> bool:
        """Create, with strict field validation (an unknown field is an error); False when it already exists (409)."""
        with failure_of(f"create {what}"):
            try:
                self.call(f"create {what}", fn, namespace, body, field_validation="Strict")
                return True
            except ApiException as exc:
                if exc.status == 409:
                    return False
                raise

    def delete(self, what: str, fn: Callable[..., Any], name: str, namespace: str, **kwargs: Any) -> bool:
        """Delete; False when it was already gone (404)."""
        with failure_of(f"delete {what}"):
            try:
                self.call(f"delete {what}", fn, name, namespace, **kwargs)
                return True
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
