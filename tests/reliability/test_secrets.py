"""Secrets never leak: tokens and webhook secrets appear in no log and no API listing; tokens are
stored only as digests.

Real traffic against a real API and a real worker, both logging at DEBUG: an admin token made over
the API, a job submitted and run (a real trainer under ft_launcher, reporting with its attempt's
token), reports sent with the job's token, a webhook subscribed and delivered. Then every file the
control plane wrote, every request the webhook receiver got, and every GET the API serves are
searched for every secret.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import httpx
import pytest

from tests.reliability.conftest import ApiProcess, worker_process
from tests.support.receivers import Receiver
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow


def test_no_secret_in_logs_listings_or_stored_tokens(tmp_path: Path, receiver: Receiver) -> None:
    workdir = tmp_path / "cp"
    data_dir = workdir / ".ftplane"
    env = {
        "FTPLANE_DATA_DIR": str(data_dir),
        "FTPLANE_LOG_LEVEL": "DEBUG",
        "FTPLANE_WEBHOOK_ALLOW_PRIVATE": "true",
        "FTPLANE_SUPERVISE_INTERVAL_S": "0.5",
        "FTPLANE_QUEUE": "ftplane-secrets-test",
    }
    api = ApiProcess(workdir, env)
    env["FTPLANE_PORT"] = str(api.port)  # the worker tells trainers where the API is
    worker = worker_process(env, workdir / "worker.log", loglevel="DEBUG")
    api.start()
    worker.start()
    try:
        secrets = run_traffic(api, workdir, receiver)
    finally:
        worker.stop()
        api.kill()

    # Tokens are stored as SHA-256 digests, and nowhere in clear.
    from sqlalchemy import create_engine, text

    engine = create_engine(f"sqlite:///{data_dir / 'ftplane.db'}")
    with engine.connect() as connection:
        digests = set(connection.execute(text("SELECT digest FROM api_tokens")).scalars())
    engine.dispose()
    for name, value in secrets.items():
        if name != "webhook secret":
            assert hashlib.sha256(value.encode()).hexdigest() in digests, f"the {name} is not stored as a digest"

    # Every file written by the control plane, its worker and the job's processes (logs at DEBUG,
    # the databases, the broker, job run state), except the two that hold a token by design.
    by_design = {data_dir / "admin-token", workdir / "attempt-token"}
    leaks = []
    files = [p for p in workdir.rglob("*") if p.is_file() and p not in by_design]
    assert any(p.name == "launcher.log" for p in files) and (workdir / "worker.log").exists()
    for path in files:
        content = path.read_bytes()
        for name, value in secrets.items():
            if value.encode() in content:
                stored_on_purpose = name == "webhook secret" and path.name.startswith("ftplane.db")
                if not stored_on_purpose:  # the signing key must be kept to sign
                    leaks.append(f"{name} in {path.relative_to(workdir)}")
    for request in receiver.requests:
        leaks += [f"{name} sent to the webhook receiver" for name, v in secrets.items() if v.encode() in request.raw()]
    assert not leaks, leaks
    assert (workdir / "api.log").stat().st_size > 0 and b"DEBUG" in (workdir / "worker.log").read_bytes()


def run_traffic(api: ApiProcess, workdir: Path, receiver: Receiver) -> dict[str, str]:
    """Real traffic; returns every secret it made, by name."""
    bootstrap = (workdir / ".ftplane" / "admin-token").read_text().strip()
    admin = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {bootstrap}"}, timeout=30)
    made_token = admin.post("/v1/tokens", json={"name": "ci"}).json()["token"]
    hook = admin.post(
        "/v1/webhooks", json={"url": receiver.url + "/hook", "event_types": ["checkpoint_saved", "succeeded"]}
    ).json()
    command = (
        'printf %s "${FTPLANE_TOKEN:-}" > "$0"; exec python -m ftplane.trainer --model tiny --steps 6 '
        "--step-delay-s 0.05 --log-every 1"
    )
    spec = {
        "name": "secrets",
        "command": ["bash", "-c", command, str(workdir / "attempt-token")],
        "procs_per_node": 1,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"dir": str(workdir / "ckpt"), "interval_steps": 3, "engine": "sync"},
        "resiliency": {"max_in_job_restarts": 0, "max_job_restarts": 0},
    }
    job = admin.post("/v1/jobs", json=spec).json()
    # The job's own token reports too (as a backend or a sidecar would).
    trainer = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {job['token']}"}, timeout=30)
    event = {"events": [{"key": "sidecar-1", "type": "checkpoint_saved", "step": 0, "details": {"by": "test"}}]}
    assert trainer.post(f"/v1/jobs/{job['id']}/events", json=event).status_code == 200
    assert trainer.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 0}]})

    status = wait_for(
        "the job to end", lambda: (s := admin.get(f"/v1/jobs/{job['id']}").json()["status"]) in END and s, 120
    )
    assert status == "SUCCEEDED", admin.get(f"/v1/jobs/{job['id']}").json()
    wait_for("webhook deliveries", lambda: len(receiver.requests) >= 3, 60)
    secrets = {
        "bootstrap admin token": bootstrap,
        "admin token made over the API": made_token,
        "job token": job["token"],
        "webhook secret": hook["secret"],
    }
    assert all(secrets.values())
    # The rank wrote what it saw of FTPLANE_TOKEN: nothing. Its node agent holds the attempt's token alone.
    assert (workdir / "attempt-token").read_text() == ""

    # Every GET the API serves, on the resources just made: listings, details, dashboard, metrics.
    openapi = admin.get("/openapi.json").json()
    deliveries = admin.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["items"]
    objective = admin.post("/v1/objectives", json={"target": 0.9}).json()
    # The fleet's ledger reads ended jobs on its own cadence: wait for it to hold the job's node (a made-up name
    # would be a 404, and every GET here must answer).
    nodes = wait_for(
        "the fleet's ledger to hold the job's node",
        lambda: [node["name"] for node in admin.get("/v1/nodes").json()["nodes"]],
        60,
    )
    ids = {
        "job_id": job["id"],
        "webhook_id": hook["id"],
        "delivery_id": deliveries[0]["id"],
        "project": "default",
        "objective_id": objective["id"],
        "name": nodes[0] if nodes else "no-such-node",  # the fleet's ledger may not have read the job yet
    }
    paths = [p for p, item in openapi["paths"].items() if "get" in item]
    paths += ["/", "/ui/jobs", "/jobs/{job_id}", "/ui/jobs/{job_id}/live", "/metrics", "/docs", "/login"]
    for path in paths:
        response = admin.get(path.format(**ids))
        assert response.status_code < 400, f"GET {path}: {response.status_code}"
        for name, value in secrets.items():
            assert value not in response.text, f"the {name} is served by GET {path}"
    listed = json.dumps(admin.get("/v1/tokens").json())
    assert all(v not in listed for v in secrets.values())
    return secrets


END = {"SUCCEEDED", "FAILED", "CANCELLED"}


def test_no_secret_in_any_log_record_even_with_sql_logging(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """In process, every logger at DEBUG and SQLAlchemy's statement log on (what `echo=True` logs: an
    operator turning it on must not be handed the secrets), the webhook delivered by the real task.

    (SQLAlchemy's row log, `sqlalchemy.engine` at DEBUG, prints result rows: that is a dump of the
    database, signing secrets included, and is not turned on by FTPLANE_LOG_LEVEL.)"""
    from fastapi.testclient import TestClient

    from tests.conftest import configure_env, tiny_spec

    configure_env(
        monkeypatch, tmp_path / "state", f"sqlite:///{tmp_path / 'ftplane.db'}", FTPLANE_WEBHOOK_ALLOW_PRIVATE="true"
    )
    from api.core.db import reset_caches, session_scope
    from api.main import create_app
    from api.models import tokens
    from api.webhooks import outbox
    from workers.tasks.webhooks import deliver_webhook

    queued: list[str] = []
    monkeypatch.setattr(outbox, "enqueue", lambda delivery_id, countdown=None: queued.append(delivery_id) or True)
    app = create_app()
    logging.getLogger().addHandler(caplog.handler)  # create_app set up logging: capture it too
    caplog.set_level("DEBUG")
    caplog.set_level("INFO", logger="sqlalchemy.engine")
    with session_scope() as session:
        _, bootstrap = tokens.create_admin(session, "tests")
    admin = TestClient(app, headers={"Authorization": f"Bearer {bootstrap}"})
    made = admin.post("/v1/tokens", json={"name": "ci"}).json()["token"]
    hook = admin.post("/v1/webhooks", json={"url": receiver.url, "event_types": ["checkpoint_saved"]}).json()
    job = admin.post("/v1/jobs", json=tiny_spec()).json()
    trainer = TestClient(app, headers={"Authorization": f"Bearer {job['token']}"})
    trainer.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "c", "type": "checkpoint_saved"}]})
    trainer.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 1}]})
    bad = TestClient(app, headers={"Authorization": f"Bearer {made}x"})
    assert bad.get("/v1/jobs").status_code == 401  # a wrong token is not logged either
    assert queued and deliver_webhook(queued[0]) == "delivered"
    for path in ("/v1/tokens", "/v1/webhooks", f"/v1/webhooks/{hook['id']}", f"/v1/jobs/{job['id']}"):
        assert admin.get(path).status_code == 200
    reset_caches()
    logging.getLogger().removeHandler(caplog.handler)

    logged = "\n".join(r.getMessage() + (str(r.exc_info) if r.exc_info else "") for r in caplog.records)
    assert "INSERT INTO webhook_subscriptions" in logged, "SQL statements were not logged: the test saw nothing"
    for name, value in {"admin token": bootstrap, "made token": made, "job token": job["token"]}.items():
        assert value not in logged, f"the {name} is in the logs"
    assert hook["secret"] not in logged, "the webhook secret is in the logs"
    assert hook["secret"].split("_", 1)[-1] not in logged
