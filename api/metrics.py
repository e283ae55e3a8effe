"""Prometheus counters, bumped where things happen (per process):

    ftplane_restarts_total{rung, cause}        restart events by rung (inprocess | injob | job) and the
                                                class the event states (`details.cause_class`, a
                                                CauseClass value: bounded, never the cause's text)
    ftplane_hangs_detected_total               hang_detected events
    ftplane_heartbeats_total                   heartbeats ingested
    ftplane_checkpoint_blocking_seconds        training time blocked per checkpoint_saved (histogram)
    ftplane_webhook_deliveries_total{outcome}  delivery tries: delivered | retrying | failed
    ftplane_stragglers_detected_total          straggler_detected events (episodes opened)
    ftplane_anomalies_total{kind}              restart anomalies: restart_storm | progress_stalled |
                                                recovery_stuck

A leaf: it imports nothing from api/services, so whatever stores events or delivers webhooks can
count. `/metrics`, its gauges read from the database and the multiprocess mode: api/routes/metrics.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import Counter, Histogram, disable_created_metrics

from api.database.tables import Event
from api.schemas.causes import CauseClass, cause_class_of
from api.schemas.events import ANOMALY_TYPES, EventType
from api.schemas.rungs import RUNG_EVENTS

RESTARTS = Counter("ftplane_restarts", "Restarts by recovery rung and cause class.", ["rung", "cause"])
HANGS = Counter("ftplane_hangs_detected", "hang_detected events stored.")
HEARTBEATS = Counter("ftplane_heartbeats", "Heartbeats ingested.")
CHECKPOINT_BLOCKING = Histogram(
    "ftplane_checkpoint_blocking_seconds",
    "Seconds training was blocked per checkpoint save.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
)
WEBHOOK_DELIVERIES = Counter("ftplane_webhook_deliveries", "Webhook delivery tries by outcome.", ["outcome"])
STRAGGLERS = Counter("ftplane_stragglers_detected", "straggler_detected events stored (episodes opened).")
ANOMALIES = Counter("ftplane_anomalies", "Restart anomalies announced, by kind.", ["kind"])

disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` twin per series: dashboards use rate()/increase()

# the `rung` label of each rung's restart event: inprocess, injob, job
RUNG_LABEL = {event.value: event.value.removesuffix("_restart") for event in RUNG_EVENTS.values()}
DELIVERY_OUTCOMES = ("delivered", "retrying", "failed")


def _zero_series() -> None:
    """Every bounded label combination from the start, so rates and sums see zeros, not gaps."""
    for rung in RUNG_LABEL.values():
        for cause in CauseClass:
            RESTARTS.labels(rung=rung, cause=cause.value)
    for outcome in DELIVERY_OUTCOMES:
        WEBHOOK_DELIVERIES.labels(outcome=outcome)
    for kind in ANOMALY_TYPES:
        ANOMALIES.labels(kind=kind.value)


@dataclass(frozen=True)
class EventFacts:
    """What the counters need from one stored event (taken before commit)."""

    type: str
    cause: CauseClass
    blocking_s: float | None

    @classmethod
    def of(cls, event: Event) -> EventFacts:
        details = event.details or {}
        blocking = details.get("blocking_s")
        if not isinstance(blocking, int | float) or isinstance(blocking, bool) or blocking < 0:
            blocking = None
        return cls(event.type, cause_class_of(details), blocking)


def events_observed(facts: Iterable[EventFacts]) -> None:
    for fact in facts:
        if fact.type in RUNG_LABEL:
            RESTARTS.labels(rung=RUNG_LABEL[fact.type], cause=fact.cause.value).inc()
        elif fact.type == EventType.hang_detected:
            HANGS.inc()
        elif fact.type == EventType.straggler_detected:
            STRAGGLERS.inc()
        elif fact.type in ANOMALY_TYPES:
            ANOMALIES.labels(kind=fact.type).inc()
        elif fact.type == EventType.checkpoint_saved and fact.blocking_s is not None:
            CHECKPOINT_BLOCKING.observe(fact.blocking_s)


def heartbeats_ingested(count: int) -> None:
    if count > 0:
        HEARTBEATS.inc(count)


def webhook_delivery(outcome: str) -> None:
    if outcome in DELIVERY_OUTCOMES:
        WEBHOOK_DELIVERIES.labels(outcome=outcome).inc()


_zero_series()
