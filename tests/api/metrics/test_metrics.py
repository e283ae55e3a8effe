"""`/metrics`: jobs by status from the database, restarts by rung and cause, hangs, heartbeats,
checkpoint blocking, webhook deliveries, goodput; and the Grafana dashboard uses those names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from api.database.tables import Event
from api.metrics import EventFacts
from api.schemas.causes import CauseClass
from api.schemas.events import utcnow
from tests.support.embedded_app import post_events, start
from tests.support.paths import REPO
from tests.support.receivers import Receiver

GRAFANA = REPO / "deploy" / "grafana" / "ftplane.json"


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics", headers={"Authorization": ""})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.mark.parametrize(
    ("details", "label"),
    [
        ({"cause": "exit code 137", "cause_class": "crash"}, "crash"),
        ({"cause": "rank 0 killed by SIGKILL (ft_launcher: no heartbeat for 20 s)", "cause_class": "hang"}, "hang"),
        ({"cause": "pod evicted: the node ran out of disk", "cause_class": "preempted"}, "preempted"),
        ({"cause": "exit code 137"}, "unknown"),  # the sentence is never read
        ({"cause": "worker group failed", "cause_class": "made-up"}, "other"),
        ({}, "unknown"),
        (None, "unknown"),
    ],
)
def test_the_cause_label_is_the_class_the_event_states(details: dict[str, Any] | None, label: str) -> None:
    event = Event(type="injob_restart", attempt=0, details=details)
    assert EventFacts.of(event).cause == label


def test_metrics_need_no_token_and_count_jobs_by_status(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    make_job()
    cancelled = make_job()
    admin.post(f"/v1/jobs/{cancelled['id']}/cancel")
    samples = scrape(admin)
    assert value(samples, "ftplane_jobs", status="PENDING") == 1
    assert value(samples, "ftplane_jobs", status="CANCELLED") == 1
    assert ("ftplane_jobs", (("status", "RUNNING"),)) in samples  # every status, zeros included


def test_restarts_hangs_checkpoints_and_heartbeats_are_counted_once(
    admin: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    job = make_job()
    start(job)
    before = scrape(admin)
    events = [
        {"key": "1", "type": "injob_restart", "details": {"cause": "exit code 137", "cause_class": "crash"}},
        {"key": "2", "type": "injob_restart", "details": {"cause": "exit code 1", "cause_class": "crash"}},
        {"key": "3", "type": "job_restart", "details": {"cause": "node n1 lost", "cause_class": "node"}},
        {"key": "4", "type": "inprocess_restart"},
        {"key": "5", "type": "hang_detected", "details": {"cause": "no heartbeat for 31 s", "cause_class": "hang"}},
        {"key": "6", "type": "checkpoint_saved", "details": {"blocking_s": 0.25, "total_s": 3}},
        {"key": "7", "type": "checkpoint_saved", "details": {"blocking_s": "n/a"}},
    ]
    post_events(admin, job, *events)
    post_events(admin, job, *events)  # a resend counts nothing
    beats = [{"rank": r, "step": 10} for r in range(3)]
    response = admin.post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": beats},
        headers={"Authorization": f"Bearer {job['token']}"},
    )
    assert response.status_code == 200
    after = scrape(admin)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("ftplane_restarts_total", rung="injob", cause="crash") == 2
    assert delta("ftplane_restarts_total", rung="job", cause="node") == 1
    assert delta("ftplane_restarts_total", rung="inprocess", cause="unknown") == 1
    assert delta("ftplane_hangs_detected_total") == 1
    assert delta("ftplane_checkpoint_blocking_seconds_count") == 1
    assert delta("ftplane_checkpoint_blocking_seconds_sum") == pytest.approx(0.25)
    assert delta("ftplane_checkpoint_blocking_seconds_bucket", le="0.25") == 1
    assert delta("ftplane_heartbeats_total") == 3
    for rung in ("inprocess", "injob", "job"):  # bounded: every class of every rung, zeros included
        labels = {dict(k[1])["cause"] for k in after if k[0] == "ftplane_restarts_total" and ("rung", rung) in k[1]}
        assert labels == {c.value for c in CauseClass}


def test_events_rolled_back_are_not_counted(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    from api import models
    from api.core.db import session_scope
    from api.schemas.events import EventBatch, EventIn, EventType
    from api.services.ingest import reporting

    job_id = make_job()["id"]
    before = scrape(admin)
    with pytest.raises(RuntimeError), session_scope() as session:
        job = models.jobs.get(session, job_id)
        assert job is not None
        batch = EventBatch(
            events=[
                EventIn(key="x", type=EventType.job_restart, details={"cause": "exit code 2", "cause_class": "crash"})
            ]
        )
        reporting.ingest_events(session, job, batch)
        raise RuntimeError("rolled back")
    after = scrape(admin)
    assert value(after, "ftplane_restarts_total", rung="job", cause="crash") == value(
        before, "ftplane_restarts_total", rung="job", cause="crash"
    )


def test_webhook_deliveries_by_outcome_and_outbox_backlog(
    admin: TestClient,
    receiver: Receiver,
    make_job: Callable[..., dict[str, Any]],
    enqueued: list[tuple[str, float | None]],
) -> None:
    from workers.tasks.webhooks import deliver_webhook

    receiver.script["/down"] = [500]
    admin.post("/v1/webhooks", json={"url": receiver.url + "/up"})
    admin.post("/v1/webhooks", json={"url": receiver.url + "/down"})
    before = scrape(admin)
    post_events(admin, make_job(), {"key": "1", "type": "job_restart"})
    for delivery_id, _ in list(enqueued):
        deliver_webhook(delivery_id)
    after = scrape(admin)
    outcome = "ftplane_webhook_deliveries_total"
    assert value(after, outcome, outcome="delivered") - value(before, outcome, outcome="delivered") == 1
    assert value(after, outcome, outcome="retrying") - value(before, outcome, outcome="retrying") == 1
    assert value(after, "ftplane_webhook_outbox", status="pending") == 1
    assert value(after, "ftplane_webhook_outbox", status="delivered") == 1


def test_goodput_gauge_of_launched_jobs(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> None:
    assert not any(k[0] == "ftplane_job_goodput_ratio" for k in scrape(admin))
    job = make_job(name="measured")
    start(job)
    now = utcnow()
    post_events(
        admin,
        job,
        {"key": "s", "type": "submitted", "ts": (now - timedelta(seconds=50)).isoformat()},
        {"key": "r", "type": "running", "ts": (now - timedelta(seconds=45)).isoformat(), "step": 0},
    )  # 5 s of initialization in 50 s of wall time
    ratio = value(scrape(admin), "ftplane_job_goodput_ratio", job_id=job["id"], job="measured")
    assert ratio == pytest.approx(0.9, abs=0.01)


def test_multiprocess_mode_sums_every_process(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR, the API's /metrics includes what worker processes counted."""
    shared = tmp_path / "prom"
    shared.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(shared), "FTPLANE_DATA_DIR": str(tmp_path / "state")}
    count = "from api import metrics; metrics.heartbeats_ingested(5); metrics.webhook_delivery('failed')"
    for _ in range(2):  # two "worker" processes
        subprocess.run([sys.executable, "-c", count], env=env, cwd=REPO, check=True, timeout=60)
    show = textwrap.dedent(
        """
        from api.core.db import upgrade_to_head
        upgrade_to_head()
        from api.routes import metrics
        print(metrics.scrape().decode())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", show], env=env, cwd=REPO, check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert re.search(r"^ftplane_heartbeats_total 10\.0$", out, re.M), out
    assert re.search(r'^ftplane_webhook_deliveries_total\{outcome="failed"\} 2\.0$', out, re.M), out
    assert re.search(r'^ftplane_jobs\{status="RUNNING"\} 0\.0$', out, re.M), out


def test_grafana_dashboard_uses_only_metrics_that_exist(admin: TestClient) -> None:
    dashboard = json.loads(GRAFANA.read_text())
    assert dashboard["title"] and dashboard["panels"]
    exposed = {name for name, _ in scrape(admin)}
    exposed |= {"ftplane_job_goodput_ratio"}  # only present with the goodput service
    expressions = [
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", []) if "expr" in target
    ]
    assert len(expressions) >= 8
    used = {name for expr in expressions for name in re.findall(r"\bftplane_[a-z_]+", expr)}
    assert used - exposed == set(), f"the dashboard queries metrics /metrics does not serve: {used - exposed}"
    for wanted in (
        "ftplane_jobs",
        "ftplane_restarts_total",
        "ftplane_hangs_detected_total",
        "ftplane_heartbeats_total",
        "ftplane_webhook_deliveries_total",
        "ftplane_checkpoint_blocking_seconds_bucket",
        "ftplane_job_goodput_ratio",
    ):
        assert wanted in used, wanted


def test_metrics_token_guards_the_scrape_when_set(
    monkeypatch: pytest.MonkeyPatch, client: TestClient, make_job: Callable[..., dict[str, Any]]
) -> None:
    from api.core.config import get_settings

    make_job(name="secret-project")
    monkeypatch.setenv("FTPLANE_METRICS_TOKEN", "scrape-me-7f3a")
    get_settings.cache_clear()
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "scrape-me-7f3a"}):
        refused = client.get("/metrics", headers={"Authorization": "", **headers})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "FTPLANE_METRICS_TOKEN" in refused.json()["error"]["message"]
        assert "scrape-me-7f3a" not in refused.text and "secret-project" not in refused.text
    assert client.get("/metrics").status_code == 401  # the client's admin token is not the scrape credential
    allowed = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-7f3a"})
    assert allowed.status_code == 200 and "ftplane_jobs" in allowed.text
    monkeypatch.delenv("FTPLANE_METRICS_TOKEN")
    get_settings.cache_clear()
    assert client.get("/metrics", headers={"Authorization": ""}).status_code == 200
