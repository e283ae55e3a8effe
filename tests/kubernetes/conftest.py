"""Fixtures for the Kubernetes backend tests: a fake API server, a backend with fast retries on the fake's clock,
and, for tests that run the supervision duties end to end, that backend behind `workers.backends.get_backend`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_kubernetes import FakeKube
from tests.support.supervision import use_backend
from workers.backends.kubernetes import KubernetesBackend, RetryPolicy


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    kube = FakeKube().start()  # refuses what a 1.33 API server refuses (schema, names, labels, immutable fields)
    yield kube
    kube.stop()


def backend_for(fake: FakeKube, **options: Any) -> KubernetesBackend:
    return KubernetesBackend(
        fake.api_client(),
        request_timeout=(2.0, 1.0),
        retry=RetryPolicy(attempts=4, base_wait_s=0.01, max_wait_s=0.05, deadline_s=10),
        clock=lambda: time.time() + fake.offset,  # the fake's clock: tests move it past tolerations
        **options,
    )


@pytest.fixture
def backend(fake: FakeKube) -> KubernetesBackend:
    """Node health read once (its first page) and then from the cache: request counts do not depend on timing."""
    return backend_for(fake, node_refresh_s=3600.0)


@pytest.fixture
def supervised(fake: FakeKube, monkeypatch: pytest.MonkeyPatch, app: Any) -> KubernetesBackend:
    """The supervision duties run against the fake cluster (and the test database of `app`)."""
    backend = backend_for(fake, node_refresh_s=0.0)
    use_backend(monkeypatch, backend)
    return backend
