"""The supervision duties' tests: a scripted backend every duty reads, and what they look at."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.causes import Cause, CauseClass
from tests.support.supervision import ScriptedBackend, use_backend

EXIT_1 = Cause(CauseClass.crash, "exit code 1", {"exit_code": 1})


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


def event_types(admin: TestClient, job_id: str) -> list[str]:
    """The job's events' types, oldest first."""
    return [e["type"] for e in admin.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["items"]]
