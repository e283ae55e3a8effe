"""`/metrics`: Prometheus text exposition.

The counters (api/metrics.py) are counted where things happen, per process. Read from the database
at scrape time (the same from every process):
    ftplane_jobs{status}                     jobs by status (every status, zeros included)
    ftplane_webhook_outbox{status}           webhook deliveries by status (pending is the backlog)
    ftplane_job_goodput_ratio{job_id, job}   ETTR of running and recently finished jobs
    ftplane_job_goodput_rolling_ratio{job_id, job, window}
                                             their ETTR over the last 5m, 15m and 1h of wall time
    ftplane_job_stragglers{job_id, job}      straggler episodes open now, per active job that is watched
    ftplane_job_straggler_score{job_id, job} the lowest rank score of its last straggler pass (1: keeps up)
    ftplane_lost_gpu_seconds_total{cause, label_key, label_value}, ftplane_productive_gpu_seconds_total{...}
                                             the fleet's GPU-seconds (counters: api/services/fleet/collector.py)
    ftplane_nodes{state}                     the fleet's nodes by state (healthy, suspect, quarantined; zeros included)

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
from collections.abc import Iterator
from datetime import timedelta

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from api import metrics  # noqa: F401  (registers the counters in the default registry)
from api.core.config import get_settings
from api.core.db import get_sessionmaker
from api.core.errors import ApiError
from api.database.tables import Job, JobWatch, WebhookDelivery
from api.models import fleet_nodes
from api.schemas.events import utcnow
from api.schemas.fleet_nodes import NodeState
from api.schemas.goodput import GoodputOut
from api.services import goodput, lifecycle
from api.services.fleet.collector import FleetCollector
from api.services.lifecycle import JobStatus

log = logging.getLogger(__name__)

OUTBOX_STATUSES = ("pending", "delivered", "failed")
GOODPUT_JOBS_MAX = 200
GOODPUT_RECENT = timedelta(hours=1)


class DatabaseCollector(Collector):
    """Gauges computed from the database at scrape time."""

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
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
            GaugeMetricFamily(
                "ftplane_job_goodput_rolling_ratio",
                "ETTR over the last window of wall time (5m, 15m, 1h) of running and recently finished jobs.",
                labels=["job_id", "job", "window"],
            ),
            GaugeMetricFamily(
                "ftplane_job_stragglers", "Straggler episodes open now, per active job.", labels=["job_id", "job"]
            ),
            GaugeMetricFamily("ftplane_nodes", "The fleet's nodes by state.", labels=["state"]),
            GaugeMetricFamily(
                "ftplane_job_straggler_score",
                "The lowest rank score of the job's last straggler pass (the job's pace over the rank's; 1 keeps up).",
                labels=["job_id", "job"],
            ),
        )

    def describe(self) -> Iterator[Metric]:
        """Names only: registering the collector must not read the database."""
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        jobs, outbox, ettr, rolling, stragglers, nodes, score = self._families()
        try:
            with get_sessionmaker()() as session:
                by_status = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
                for status in sorted({s.value for s in JobStatus} | set(by_status)):
                    jobs.add_metric([status], by_status.get(status, 0))
                deliveries = dict(
                    session.execute(select(WebhookDelivery.status, func.count()).group_by(WebhookDelivery.status)).all()
                )
                for status in sorted(set(OUTBOX_STATUSES) | set(deliveries)):
                    outbox.add_metric([status], deliveries.get(status, 0))
                by_state = fleet_nodes.count_by_state(session)
                for state in sorted({s.value for s in NodeState} | set(by_state)):
                    nodes.add_metric([state], by_state.get(state, 0))
                for job, out in _goodput(session):
                    if out.ettr is not None:
                        ettr.add_metric([job.id, job.name], out.ettr)
                    for window in out.rolling:
                        if window.ettr is not None:
                            rolling.add_metric([job.id, job.name, f"{window.window_s / 60:g}m"], window.ettr)
                for job, watch in _watched(session):
                    stragglers.add_metric([job.id, job.name], watch.open_stragglers)
                    lowest = (watch.stragglers or {}).get("lowest")
                    if isinstance(lowest, int | float):
                        score.add_metric([job.id, job.name], lowest)
        except Exception:  # a scrape must answer even with the database away
            log.warning("metrics: the database could not be read", exc_info=True)
            return
        yield from (jobs, outbox, ettr, rolling, stragglers, nodes, score)


def _watched(session: Session) -> Iterator[tuple[Job, JobWatch]]:
    """Active jobs the straggler duty watches."""
    rows = session.execute(
        select(Job, JobWatch)
        .join(JobWatch, JobWatch.job_id == Job.id)
        .where(Job.status.in_([s.value for s in lifecycle.ACTIVE]))
        .order_by(Job.created_at.desc())
        .limit(GOODPUT_JOBS_MAX)
    )
    yield from rows.tuples()


def _goodput(session: Session) -> Iterator[tuple[Job, GoodputOut]]:
    """The goodput of each launched job that runs or finished within GOODPUT_RECENT, newest first."""
    recent = utcnow() - GOODPUT_RECENT
    rows = session.scalars(
        select(Job)
        .where(or_(Job.finished_at.is_(None), Job.finished_at >= recent), Job.status != JobStatus.PENDING.value)
        .order_by(Job.created_at.desc())
        .limit(GOODPUT_JOBS_MAX)
    )
    for job in rows:
        out = goodput.job_goodput(session, job)
        if out is not None:
            yield job, out


_DATABASE_COLLECTOR = DatabaseCollector()
REGISTRY.register(_DATABASE_COLLECTOR)
_FLEET_COLLECTOR = FleetCollector()  # lost GPU-seconds by cause and label (api/services/fleet/collector.py)
REGISTRY.register(_FLEET_COLLECTOR)


def scrape() -> bytes:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(_DATABASE_COLLECTOR)
        registry.register(_FLEET_COLLECTOR)
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
