"""Fixtures and helpers shared by tests/api/webhooks, tests/dashboard and tests/api/metrics.

Each test gets its own SQLite database and embedded broker under tmp_path. Webhook deliveries
are not sent to a broker in unit tests: `enqueued` captures them and tests run the delivery
task in-process (eagerly). One end-to-end test runs a real Celery worker. The fake receiver
(`receiver` fixture) is tests/support/receivers.py's, from tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import configure_env


def point_at(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **extra: str) -> None:
    """Point settings, database (SQLite) and broker at this test's own state; receivers are on 127.0.0.1."""
    configure_env(
        monkeypatch,
        tmp_path / "state",
        f"sqlite:///{tmp_path / 'ftplane.db'}",
        FTPLANE_WEBHOOK_ALLOW_PRIVATE="true",
        **extra,
    )


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    point_at(monkeypatch, tmp_path)
    yield tmp_path
    from api.core.db import reset_caches

    reset_caches()


@pytest.fixture
def enqueued(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float | None]]:
    """Delivery tasks the code asked for (id, countdown), instead of sending them to a broker."""
    from api.webhooks import outbox

    calls: list[tuple[str, float | None]] = []

    def capture(delivery_id: str, countdown: float | None = None) -> bool:
        calls.append((delivery_id, countdown))
        return True

    monkeypatch.setattr(outbox, "enqueue", capture)
    return calls


@pytest.fixture
def app(env: Path, enqueued: list[tuple[str, float | None]]) -> Any:
    """The app of tests/conftest.py (whose client, admin and make_job fixtures use this one), with
    webhook deliveries captured."""
    from api.main import create_app

    return create_app()


def start(job: dict[str, Any]) -> None:
    """What the launch does (PENDING -> SUBMITTED), without launching anything."""
    from api import models
    from api.core.db import session_scope
    from api.services import lifecycle

    with session_scope() as session:
        row = models.jobs.get(session, job["id"])
        assert row is not None
        lifecycle.transition(session, row, lifecycle.JobStatus.SUBMITTED)


def post_events(client: TestClient, job: dict[str, Any], *events: dict[str, Any]) -> dict[str, Any]:
    """Report events with the job's own trainer token, as a trainer would."""
    response = client.post(
        f"/v1/jobs/{job['id']}/events",
        json={"events": list(events)},
        headers={"Authorization": f"Bearer {job['token']}"},
    )
    assert response.status_code == 200, response.text
    return dict(response.json())
