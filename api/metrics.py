"""Prometheus metrics at `/metrics`.

Counted where they happen (per process):
    ftplane_restarts_total{rung, cause}      restart events by rung (inprocess | injob | job) and
                                              cause class (crash | node | hang | exception | launch |
                                              other | unknown: bounded, never the raw text)
    ftplane_hangs_detected_total             hang_detected events
    ftplane_heartbeats_total                 heartbeats ingested
    ftplane_checkpoint_blocking_seconds      training time blocked per checkpoint_saved (histogram)
    ftplane_webhook_deliveries_total{outcome}  delivery tries: delivered | retrying | failed

Read from the database at scrape time (the same from every process):
    ftplane_jobs{status}                     jobs by status
    ftplane_webhook_outbox{status}           webhook deliveries by status (pending is the backlog)
    ftplane_job_goodput_ratio{job_id, job}   ETTR of running and recently finished jobs (when the
                                              goodput service is installed)

Events are stored both by the API (trainer reports) and by the workers (supervision: job
restarts, hangs), and webhooks are delivered by the workers. Scrape every process, or run them
all with PROMETHEUS_MULTIPROC_DIR pointing at one shared, empty directory (prometheus_client's
multiprocess mode; set it before start): `/metrics` then sums the counters of every API and
worker process on the host.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select

from api.core.config import get_settings
from api.core.errors import ApiError
from api.database.tables import Event, Job, WebhookDelivery
from api.schemas.events import RESTART_TYPES, EventType, utcnow
from api.services import goodput_view

log = logging.getLogger(__name__)

RESTARTS = Counter("ftplane_restarts", "Restarts by recovery rung and cause class.", ["rung", "cause"])
HANGS = Counter("ftplane_hangs_detected", "hang_detected events stored.")
HEARTBEATS = Counter("ftplane_heartbeats", "Heartbeats ingested.")
CHECKPOINT_BLOCKING = Histogram(
    "ftplane_checkpoint_blocking_seconds",
    "Seconds training was blocked per checkpoint save.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
WEBHOOK_DELIVERIES = Counter("ftplane_webhook_deliveries", "Webhook delivery tries by outcome.", ["outcome"])

disable_created_metrics()  # no `_created` twin per series: dashboards use rate()/increase()

JOB_STATUSES = ("PENDING", "SUBMITTED", "RUNNING", "RECOVERING", "SUCCEEDED", "FAILED", "CANCELLED")
OUTBOX_STATUSES = ("pending", "delivered", "failed")
GOODPUT_JOBS_MAX = 200
GOODPUT_RECENT = timedelta(hours=1)

# Cause classes, first match wins; the raw cause text never becomes a label (unbounded cardinality).
_CAUSE_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # A rank killed for silence is a hang, though the cause names the signal that ended it.
    ("hang", re.compile(r"no heartbeat", re.I)),
    ("crash", re.compile(r"exit code|exit status|signal|\bsig[a-z]+\b|killed|\boom\b|out of memory", re.I)),
    ("node", re.compile(r"\bnode\b|evict|preempt", re.I)),
    ("hang", re.compile(r"heartbeat|hang|timeout|timed out|silent|stuck|no progress", re.I)),
    ("exception", re.compile(r"error|exception|traceback|raise", re.I)),
    ("launch", re.compile(r"launch", re.I)),
)


RUNG_LABELS = ("inprocess", "injob", "job")
CAUSE_LABELS = (*dict.fromkeys(name for name, _ in _CAUSE_CLASSES), "other", "unknown")
DELIVERY_OUTCOMES = ("delivered", "retrying", "failed")


def _zero_series() -> None:
    """Every bounded label combination from the start, so rates and sums see zeros, not gaps."""
    for rung in RUNG_LABELS:
        for cause in CAUSE_LABELS:
            RESTARTS.labels(rung=rung, cause=cause)
    for outcome in DELIVERY_OUTCOMES:
        WEBHOOK_DELIVERIES.labels(outcome=outcome)


def cause_class(cause: object) -> str:
    if not isinstance(cause, str) or not cause.strip():
        return "unknown"
    for name, pattern in _CAUSE_CLASSES:
        if pattern.search(cause):
            return name
    return "other"


@dataclass(frozen=True)
class EventFacts:
    """What the counters need from one stored event (taken before commit)."""

    type: str
    cause: str
    blocking_s: float | None

    @classmethod
    def of(cls, event: Event) -> EventFacts:
        details = event.details or {}
        blocking = details.get("blocking_s")
        if not isinstance(blocking, int | float) or isinstance(blocking, bool) or blocking < 0:
            blocking = None
        return cls(event.type, cause_class(details.get("cause")), blocking)


def events_observed(facts: Iterable[EventFacts]) -> None:
    for fact in facts:
        if fact.type in RESTART_TYPES:
            RESTARTS.labels(rung=fact.type.removesuffix("_restart"), cause=fact.cause).inc()
        elif fact.type == EventType.hang_detected:
            HANGS.inc()
        elif fact.type == EventType.checkpoint_saved and fact.blocking_s is not None:
            CHECKPOINT_BLOCKING.observe(fact.blocking_s)


def heartbeats_ingested(count: int) -> None:
    if count > 0:
        HEARTBEATS.inc(count)


def webhook_delivery(outcome: str) -> None:
    if outcome in DELIVERY_OUTCOMES:
        WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


_zero_series()


class DatabaseCollector(Collector):
    """Gauges computed from the database at scrape time."""

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("ftplane_jobs", "Jobs by status.", labels=["status"]),
            GaugeMetricFamily(
                "ftplane_webhook_outbox",
                "Webhook deliveries by status (pending: the backlog).",
                labels=["status"],
            ),
            GaugeMetricFamily(
                "ftplane_job_goodput_ratio",
                "Effective training time ratio (productive / wall) of running and recently finished jobs.",
                labels=["job_id", "job"],
            ),
        )

    def describe(self) -> Iterator[Metric]:
        """Names only: registering the collector must not read the database."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        from api.core.db import get_sessionmaker

        jobs, outbox, goodput = self._families()
        try:
            with get_sessionmaker()() as session:
                by_status = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
                for status in sorted(set(JOB_STATUSES) | set(by_status)):
                    jobs.add_metric([status], by_status.get(status, 0))
                deliveries = dict(
                    session.execute(select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status)).all()
                )
                for status in sorted(set(OUTBOX_STATUSES) | set(deliveries)):
                    outbox.add_metric([status], deliveries.get(status, 0))
                for job, ratio in _goodput(session):
                    goodput.add_metric([job.id, job.name], ratio)
        except Exception:  # a scrape must answer even with the database away
            log.warning("metrics: the database could not be read", exc_info=True)
            return
        yield jobs
        yield outbox
        yield goodput


def _goodput(session: Any) -> Iterator[tuple[Job, float]]:
    if not goodput_view.goodput_available():
        return
    recent = utcnow() - GOODPUT_RECENT
    rows = session.scalars(
        select(Job)
        .where(or_(Job.finished_at.is_(None), Job.finished_at >= recent), Job.status != "PENDING")
        .order_by(Job.created_at.desc())
        .limit(GOODPUT_JOBS_MAX)
    )
    for job in rows:
        view = goodput_view.goodput_of(session, job)
        if view is not None and view.ettr is not None:
            yield job, view.ettr


_DATABASE_COLLECTOR = DatabaseCollector()
REGISTRY.register(_DATABASE_COLLECTOR)


def scrape() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(_DATABASE_COLLECTOR)
        return generate_latest(registry)
    return generate_latest(REGISTRY)


router = APIRouter(tags=["metrics"])


@router.get("/metrics", include_in_schema=False)
def metrics_endpoint(request: Request) -> Response:
    """Prometheus text exposition; behind a bearer token when FTPLANE_METRICS_TOKEN is set (the figures
    name jobs), else open, like most exporters (restrict it at the network)."""
    expected = get_settings().metrics_token
    if expected is not None:
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {expected.get_secret_value()}".encode()):
            raise ApiError(
                401,
                "/metrics needs 'Authorization: Bearer <FTPLANE_METRICS_TOKEN>'",
                field="Authorization",
                headers={"WWW-Authenticate": "Bearer"},
            )
    return Response(scrape(), media_type=CONTENT_TYPE_LATEST)
