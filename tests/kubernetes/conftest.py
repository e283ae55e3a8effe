"""Fixtures for the Kubernetes backend tests: a fake API server and a backend with fast retries."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fake_kubernetes import FakeKube
from workers.backends.kubernetes import KubernetesBackend, RetryPolicy


@pytest.fixture
def fake() -> Iterator[FakeKube]:
    kube = FakeKube().start()  # refuses what a 1.33 API server refuses (schema, names, labels, immutable fields)
    yield kube
    kube.stop()


@pytest.fixture
def backend(fake: FakeKube) -> KubernetesBackend:
    return KubernetesBackend(
        fake.api_client(),
        request_timeout=(2.0, 1.0),
        retry=RetryPolicy(attempts=4, base_wait_s=0.01, max_wait_s=0.05, deadline_s=10),
    )
