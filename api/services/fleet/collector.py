"""Prometheus counters of the fleet's GPU-seconds, read from goodput_counters at scrape time (the same from every
process):

    ftplane_lost_gpu_seconds_total{cause, label_key, label_value}    GPU-seconds lost, by the goodput's buckets
    ftplane_productive_gpu_seconds_total{label_key, label_value}     GPU-seconds trained

per value of each label key in FTPLANE_GOODPUT_METRIC_LABELS (label_value "" for jobs without the label). The
summarize duty adds what each job's GPU-seconds grew by since it last counted them (never less: a recomputation
that moves time between causes only adds), closed time and a running job's time up to its summary. Fleet ETTR over
a range: 1 - increase(lost) / (increase(lost) + increase(productive)).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select

from api.core.db import get_sessionmaker
from api.database.tables import GoodputCounter
from api.schemas.goodput import LOST_BUCKETS

log = logging.getLogger(__name__)


class FleetCollector(Collector):
    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily]:
        return (
            CounterMetricFamily(
                "ftplane_lost_gpu_seconds",
                "GPU-seconds lost by the fleet's jobs, by cause and label value.",
                labels=["cause", "label_key", "label_value"],
            ),
            CounterMetricFamily(
                "ftplane_productive_gpu_seconds",
                "GPU-seconds of productive training of the fleet's jobs, by label value.",
                labels=["label_key", "label_value"],
            ),
        )

    def describe(self) -> Iterator[Metric]:
        yield from self._families()

    def collect(self) -> Iterator[Metric]:
        lost, productive = self._families()
        try:
            with get_sessionmaker()() as session:
                rows = session.execute(
                    select(
                        GoodputCounter.label_key,
                        GoodputCounter.label_value,
                        GoodputCounter.bucket,
                        GoodputCounter.gpu_seconds,
                    ).order_by(GoodputCounter.label_key, GoodputCounter.label_value, GoodputCounter.bucket)
                ).all()
        except Exception:  # a scrape must answer even with the database away
            log.warning("metrics: the fleet's counters could not be read", exc_info=True)
            return
        seen: dict[tuple[str, str], set[str]] = {}
        for key, value, bucket, seconds in rows:
            if bucket == "productive":
                productive.add_metric([key, value], seconds)
            elif bucket in LOST_BUCKETS:
                lost.add_metric([bucket, key, value], seconds)
            seen.setdefault((key, value), set()).add(bucket)
        for (key, value), buckets in seen.items():  # every cause of a label value, zeros included
            for bucket in LOST_BUCKETS:
                if bucket not in buckets:
                    lost.add_metric([bucket, key, value], 0.0)
            if "productive" not in buckets:
                productive.add_metric([key, value], 0.0)
        yield from (lost, productive)
