"""The send-only side of the task queue: how the API (and anything else) hands work to the workers.

Work is sent by task name (Celery's `send_task`), so nothing here imports the workers' code: the
names below are the contract, and `workers/` registers a task under each. The broker comes from
the settings: Redis when `FTPLANE_REDIS_URL` is set, otherwise an embedded broker that needs no
server (kombu's SQLAlchemy transport on a SQLite file under the data directory).
`workers/celery_app.py` builds the worker's app on the same broker settings.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
from typing import Any

from celery import Celery

from api.core.config import Settings, get_settings

log = logging.getLogger(__name__)

# ---- task names ---------------------------------------------------------------------------------

SUBMIT_JOB = "ftplane.submit_job"
CANCEL_JOB = "ftplane.cancel_job"
DELIVER_WEBHOOK = "ftplane.deliver_webhook"
SWEEP_WEBHOOK_DELIVERIES = "ftplane.sweep_webhook_deliveries"
PURGE_CONSUMED_MESSAGES = "ftplane.purge_consumed_messages"


# ---- broker settings ----------------------------------------------------------------------------


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
        # These go to create_engine: wait on a locked database instead of failing at once, and
        # connect as BrokerConnection.
        "broker_transport_options": {"connect_args": {"timeout": 30, "factory": BrokerConnection}},
    }


class BrokerConnection(sqlite3.Connection):
    """The embedded broker's SQLite connections: write-ahead log, synced at checkpoints. In SQLite's
    default rollback journal every message sent and every poll of an empty queue synced the disk,
    and an idle control plane spent a quarter of a core on it. A message committed before a
    power loss may be lost (an OS crash or a killed process loses none); a lost duty message
    is sent again at its next period, and a lost job launch is redone by the launch duty."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")
        self.execute("PRAGMA synchronous=NORMAL")


def embedded_broker_url(settings: Settings) -> str:
    broker_db = (settings.data_dir / "broker.sqlite").resolve()
    broker_db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{broker_db}"


def prepare_embedded_broker(settings: Settings) -> None:
    """Create the embedded broker's tables and the queue's row before the processes that use it start. kombu's
    SQLAlchemy transport makes them on first use, and a worker, its beat and the API starting together on a new
    data directory raced: "table kombu_queue already exists", then "UNIQUE constraint failed: kombu_queue.name",
    and the worker stopped for good (its jobs stayed PENDING). Under a file lock, so that parts started apart
    cannot race either. Nothing to do with Redis."""
    if settings.redis_url:
        return
    app = Celery("ftplane-broker", set_as_current=False)
    app.conf.update(celery_config(settings))
    lock_path = settings.data_dir / "broker.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with app.connection_for_write() as connection:  # its channel creates the tables
            connection.default_channel.queue_declare(queue=settings.queue)


def celery_config(settings: Settings) -> dict[str, object]:
    """The Celery settings sender and worker share: broker, queue, message format."""
    return {
        **broker_settings(settings),
        "task_default_queue": settings.queue,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
    }


# ---- the producer -------------------------------------------------------------------------------

_lock = threading.Lock()
_producer: tuple[Settings, Celery] | None = None


def producer() -> Celery:
    """A Celery app that only sends, built on first use from the current settings (and built again
    when they are reloaded, as tests do when they switch brokers)."""
    global _producer
    settings = get_settings()
    with _lock:
        if _producer is None or _producer[0] is not settings:
            if _producer is not None:
                _producer[1].close()  # connections to the previous broker
            app = Celery("ftplane-producer", set_as_current=False)
            app.conf.update(celery_config(settings))
            _producer = (settings, app)
        return _producer[1]


def send(task_name: str, *args: Any, countdown: float | None = None) -> bool:
    """Enqueue; False when the broker is unreachable (a sweep picks the work up later)."""
    try:
        producer().send_task(task_name, args=list(args), countdown=countdown)
        return True
    except Exception:  # the broker being down must not fail an accepted request
        log.warning("could not enqueue %s for %s; a later sweep will retry it", task_name, args, exc_info=True)
        return False


def broker_reachable(timeout: float = 2.0) -> None:
    """Raises when the broker cannot be reached within `timeout` seconds."""
    with producer().connection_for_write() as connection:
        connection.ensure_connection(max_retries=1, timeout=timeout)
