"""Task (beat): housekeeping of the embedded broker.

kombu's SQLAlchemy transport marks consumed messages invisible but never deletes them, so an
embedded `ftplane serve` would grow its broker file forever (two beat messages a second).
"""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from api.core.config import get_settings
from api.core.queue import PURGE_CONSUMED_MESSAGES, embedded_broker_url
from workers.celery_app import celery_app


@celery_app.task(name=PURGE_CONSUMED_MESSAGES)
def purge_consumed_messages() -> int:
    settings = get_settings()
    if settings.redis_url:
        return 0
    engine = create_engine(embedded_broker_url(settings), connect_args={"timeout": 30})
    try:
        if not inspect(engine).has_table("kombu_message"):
            return 0
        with engine.begin() as connection:
            result = connection.execute(text("DELETE FROM kombu_message WHERE visible = 0"))
        return int(result.rowcount)
    finally:
        engine.dispose()
