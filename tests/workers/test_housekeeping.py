"""The embedded broker does not grow forever (consumed messages are purged), and does not sync the disk for every
message and poll."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import configure_env


def test_consumed_messages_are_purged_and_pending_ones_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    configure_env(monkeypatch, tmp_path / "state", f"sqlite:///{tmp_path / 'ftplane.db'}")
    from api.core.config import get_settings
    from api.core.queue import embedded_broker_url
    from workers.celery_app import celery_app
    from workers.tasks.housekeeping import purge_consumed_messages

    for _ in range(3):
        celery_app.send_task("ftplane.supervise_jobs")
    engine = create_engine(embedded_broker_url(get_settings()))
    with engine.begin() as connection:  # two of them consumed, as a worker would leave them
        connection.execute(
            text("UPDATE kombu_message SET visible = 0 WHERE id IN (SELECT id FROM kombu_message LIMIT 2)")
        )
    assert purge_consumed_messages() == 2
    with engine.connect() as connection:
        left = connection.execute(text("SELECT visible FROM kombu_message")).scalars().all()
    engine.dispose()
    assert left == [1]


def test_the_embedded_broker_keeps_a_write_ahead_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Its connections (kombu's own engine) use the WAL, synced at checkpoints only."""
    configure_env(monkeypatch, tmp_path / "state", f"sqlite:///{tmp_path / 'ftplane.db'}")
    from api.core.config import get_settings
    from api.core.queue import embedded_broker_url
    from workers.celery_app import celery_app

    celery_app.send_task("ftplane.supervise_jobs")
    with celery_app.connection_for_write() as connection:
        session = connection.default_channel.session
        assert session.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    engine = create_engine(embedded_broker_url(get_settings()))  # a plain connection reads the file's mode
    with engine.connect() as plain:
        assert plain.execute(text("PRAGMA journal_mode")).scalar() == "wal"
    engine.dispose()
