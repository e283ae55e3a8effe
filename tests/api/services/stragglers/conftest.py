from __future__ import annotations

from typing import Any

import pytest

from tests.support.supervision import ScriptedBackend, use_backend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted
