"""The embedded broker is made ready before the processes that share it start (api/core/queue.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from api.core.config import Settings
from api.core.queue import prepare_embedded_broker


def queues(data_dir: Path) -> list[str]:
    with sqlite3.connect(data_dir / "broker.sqlite") as broker:
        return [name for (name,) in broker.execute("SELECT name FROM kombu_queue")]


def test_the_tables_and_the_queue_exist_before_any_worker_starts(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, queue="jobs-a")
    prepare_embedded_broker(settings)
    prepare_embedded_broker(settings)  # again, as every `ftplane serve` does: nothing more
    assert queues(tmp_path) == ["jobs-a"]
    with sqlite3.connect(tmp_path / "broker.sqlite") as broker:
        assert broker.execute("SELECT count(*) FROM kombu_message").fetchone() == (0,)


def test_nothing_is_made_with_redis(tmp_path: Path) -> None:
    prepare_embedded_broker(Settings(data_dir=tmp_path, redis_url="redis://127.0.0.1:1/0"))
    assert not (tmp_path / "broker.sqlite").exists()
