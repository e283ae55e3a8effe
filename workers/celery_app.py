"""The Celery application: Redis when configured, otherwise an embedded broker that needs no server."""

from __future__ import annotations

from pathlib import Path

from celery import Celery
from kombu.transport import sqlalchemy as kombu_sqlalchemy

from api.core.config import Settings, get_settings

# The SQLAlchemy transport polls once a second by default, and its transport options go to
# create_engine, so its polling interval can only be set on the class.
kombu_sqlalchemy.Transport.polling_interval = 0.1

TASK_MODULES = [
    "workers.tasks.submit",
    "workers.tasks.supervise",
    "workers.tasks.cancel",
    "workers.tasks.faults",
    "workers.tasks.webhooks",
    "workers.tasks.housekeeping",
]


def broker_settings(settings: Settings) -> dict[str, object]:
    if settings.redis_url:
        return {
            "broker_url": settings.redis_url,
            "result_backend": settings.redis_url,
            # Unacked tasks of a dead worker come back after this long (acks_late).
            "broker_transport_options": {"visibility_timeout": 3600},
        }
    # kombu's SQLAlchemy transport on a SQLite file: transactional, so a message is never read
    # half-written (the filesystem transport can be), and no server is needed.
    return {
        "broker_url": f"sqla+{embedded_broker_url(settings)}",
        "result_backend": None,
        # These go to create_engine: wait on a locked database instead of failing at once.
        "broker_transport_options": {"connect_args": {"timeout": 30}},
    }


def embedded_broker_url(settings: Settings) -> str:
    broker_db = (settings.data_dir / "broker.sqlite").resolve()
    broker_db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{broker_db}"


def make_celery(settings: Settings | None = None) -> Celery:
    app = Celery("ftplane", include=TASK_MODULES)
    configure(app, settings or get_settings())
    return app


def configure(app: Celery, settings: Settings) -> None:
    """(Re)apply settings: at start, and in tests that switch databases and brokers."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)  # beat keeps its schedule there
    app.conf.update(
        broker_settings(settings),
        task_default_queue=settings.queue,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            "supervise-jobs": {
                "task": "ftplane.supervise_jobs",
                "schedule": settings.supervise_interval_s,
                "options": {"expires": settings.supervise_interval_s * 3},
            },
            "purge-consumed-messages": {
                "task": "ftplane.purge_consumed_messages",
                "schedule": 60.0,
                "options": {"expires": 120.0},
            },
            "sweep-webhook-deliveries": {  # deliveries whose task was lost, and retries far ahead
                "task": "ftplane.sweep_webhook_deliveries",
                "schedule": 10.0,
                "options": {"expires": 30.0},
            },
        },
        beat_schedule_filename=str(Path(settings.data_dir).resolve() / "celerybeat-schedule"),
        worker_hijack_root_logger=False,
    )
    if app._pool is not None:  # drop connections made with the previous broker settings
        app._pool.force_close_all()
        app._pool = None
        app.amqp._producer_pool = None


celery_app = make_celery()


def broker_reachable(timeout: float = 2.0) -> None:
    """Raises when the broker cannot be reached."""
    with celery_app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout)
