"""Fixtures for the Kubernetes backend tests: a fake API server, a backend with fast retries on the fake's clock,
and, for tests that run the supervision duties end to end, that backend behind `workers.backends.get_backend`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.fake_kubernetes import FakeKube
from tests.support.supervision import use_backend
from tests.workers.backends.kubernetes.k8s_support import backend_for
from workers.backends.kubernetes import KubernetesBackend


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    kube = FakeKube().start()  # refuses what a 1.33 API server refuses (schema, names, labels, immutable fields)
    yield kube
    kube.stop()


@pytest.fixture
def backend(fake: FakeKube) -> Iterator[KubernetesBackend]:
    """Node health read once (its first page) and then from the cache: request counts do not depend on timing."""
    backend = backend_for(fake, node_refresh_s=3600.0)
    yield backend
    backend.close()


@pytest.fixture
def supervised(fake: FakeKube, monkeypatch: pytest.MonkeyPatch, app: Any) -> Iterator[KubernetesBackend]:
    """The supervision duties run against the fake cluster (and the test database of `app`)."""
    backend = backend_for(fake, node_refresh_s=0.0)
    use_backend(monkeypatch, backend)
    yield backend
    backend.close()
