"""A fresh database per test (SQLite, and PostgreSQL when configured): tests/support/fleet.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy.orm import Session

from tests.support.fleet import fleet_db


@pytest.fixture
def db(env: str) -> Iterator[Session]:
    with fleet_db() as session:
        yield session
