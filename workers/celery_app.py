"""The Celery application the workers and beat run: the tasks, their schedule, and how a worker consumes.

The broker and message settings are the send-only queue's (`api/core/queue.py`): Redis when
configured, otherwise an embedded broker that needs no server. Senders address tasks by the names
defined there.
"""

from __future__ import annotations

from pathlib import Path

from celery import Celery, signals
from kombu.transport import sqlalchemy as kombu_sqlalchemy

from api.core import heap
from api.core.config import Settings, get_settings
from api.core.queue import celery_config
from workers.supervision import DUTIES

# The SQLAlchemy transport polls once a second by default, and its transport options go to
# create_engine, so its polling interval can only be set on the class.
kombu_sqlalchemy.Transport.polling_interval = 0.1

TASK_MODULES = [
    "workers.tasks.jobs",
    "workers.tasks.duties",
    "workers.tasks.webhooks",
    "workers.tasks.housekeeping",
]

# The supervision duties' tasks (workers/tasks/duties.py), each its own beat entry at the supervision period.
DUTY_TASKS = tuple(duty.task for duty in DUTIES)


def make_celery(settings: Settings | None = None) -> Celery:
    app = Celery("ftplane", include=TASK_MODULES)
    configure(app, settings or get_settings())
    return app


def configure(app: Celery, settings: Settings) -> None:
    """(Re)apply settings: at start, and in tests that switch databases and brokers."""
    Path(settings.data_dir).mkdir(parents=True, exist_ok=True)  # beat keeps its schedule there
    app.conf.update(
        celery_config(settings),
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        beat_schedule={
            **{
                duty.beat_entry: {
                    "task": duty.task,
                    "schedule": duty.period_s(settings),
                    "options": {"expires": duty.period_s(settings) * 3},
                }
                for duty in DUTIES
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


@signals.worker_ready.connect
@signals.beat_init.connect
def settle_heap(**_: object) -> None:
    """A started worker or beat settles its heap before its first task or tick (`api/core/heap.py`): a long full
    collection would stretch a supervision pass."""
    heap.settle()
