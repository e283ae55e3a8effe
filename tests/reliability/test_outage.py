"""The control plane down for 30 s under a real trainer: training goes on, nothing is lost.

A real `python -m ftplane.trainer` (standalone, one rank) under its node agent reports to a real API (uvicorn);
the API is killed and comes back 30 s later on the same port. The trainer's `--metrics-file` records each step:
training must go on through the outage at its pace, and every event reported meanwhile (the agent buffers it)
must be stored afterwards, once and in order. That a step never waits on the agent (no socket call on the
training thread) is tests/trainer/sdk/test_run.py's; how long a report takes is bench.ingest's.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import configure_env
from tests.reliability.conftest import ApiProcess, child_env
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

OUTAGE_S = 30.0
STEP_DELAY_S = 0.1
STEPS = 10_000  # more than run: the trainer is stopped once the outage has been caught up on
CHECKPOINT_EVERY = 40


def test_the_trainer_keeps_training_through_an_outage_and_every_event_arrives(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    database = tmp_path / "ftplane.db"
    configure_env(monkeypatch, tmp_path / "state", f"sqlite:///{database}")
    from api import models
    from api.core.db import session_scope
    from api.main import create_app
    from api.schemas.spec import JobSpec

    create_app()  # migrates
    with session_scope() as session:
        job = models.jobs.create(session, JobSpec(name="outage", command=["python", "-m", "ftplane.trainer"]))
        _, trainer_token = models.tokens.create_trainer(session, job.id)
        _, admin_token = models.tokens.create_admin(session, "tests")
        job_id = job.id
    api = ApiProcess(
        tmp_path / "api", {"FTPLANE_DATABASE_URL": f"sqlite:///{database}", "FTPLANE_DATA_DIR": str(tmp_path / "s")}
    ).start()
    admin = httpx.Client(base_url=api.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=10)

    metrics = tmp_path / "metrics.jsonl"
    command = [
        sys.executable, "-m", "ftplane.trainer.agent", "--",
        sys.executable, "-m", "ftplane.trainer", "--model", "tiny", "--steps", str(STEPS),
        "--step-delay-s", str(STEP_DELAY_S), "--metrics-file", str(metrics), "--log-every", "50",
    ]  # fmt: skip
    env = child_env(
        FTPLANE_URL=api.url,
        FTPLANE_JOB_ID=job_id,
        FTPLANE_ATTEMPT="0",
        FTPLANE_TOKEN=trainer_token,
        FTPLANE_NODE_NAME="outage-node",
        FTPLANE_AGENT_DIR=str(tmp_path / "agent"),
        FTPLANE_CHECKPOINT_DIR=str(tmp_path / "ckpt"),
        FTPLANE_CHECKPOINT_ENGINE="async",
        FTPLANE_CHECKPOINT_INTERVAL=str(CHECKPOINT_EVERY),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    log = tmp_path / "trainer.log"
    with log.open("wb") as out:
        trainer = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for("the trainer to report step 30", lambda: reported_step(admin, job_id) >= 30, 90, interval=0.2)
        api.kill(signal.SIGKILL)
        down = time.time()
        time.sleep(OUTAGE_S)  # the outage itself is what is under test
        api.start()
        up = time.time()
        reached = last_step(metrics)  # what the trainer had done, and so reported, when the API came back
        caught_up = (reached // CHECKPOINT_EVERY - 1) * CHECKPOINT_EVERY  # the last save may still be writing
        wait_for(
            "the events of the outage to arrive",
            lambda: checkpoints(all_events(admin, job_id)) >= caught_up and reported_step(admin, job_id) >= reached,
            30,
            interval=0.5,
        )
        assert trainer.poll() is None, log.read_text()[-3000:]  # still training
        events = all_events(admin, job_id)
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)  # the agent and the trainer under it
        trainer.wait(30)
        api.kill(signal.SIGTERM)

    # Training went on while the control plane was away, at the pace it had before (half of it at the least: the
    # machine's load may move between the two windows; a trainer waiting on the control plane would do ~none).
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    before = [r for r in rows if r["t"] < down]
    during = [r for r in rows if down < r["t"] < up]
    usual = statistics.median(r["step_s"] for r in before[5:])
    assert len(during) >= 0.5 * OUTAGE_S / usual, f"only {len(during)} steps ran during the outage"

    # Every event arrived, once, in the order it was made; those of the outage were stored after it.
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert sorted(e["step"] for e in saved) == list(range(CHECKPOINT_EVERY, checkpoints(events) + 1, CHECKPOINT_EVERY))
    assert len({e["key"] for e in events}) == len(events)
    assert len([e for e in events if e["type"] == "running" and e["details"].get("source") != "agent"]) == 1
    ranks_own = [e["ts"] for e in events if e["rank"] == 0 and e["details"].get("source") not in ("agent", "launcher")]
    assert ranks_own == sorted(ranks_own), "the rank's events were stored out of order"
    in_outage = [e for e in saved if down < datetime.fromisoformat(e["ts"]).timestamp() < up]
    assert len(in_outage) >= max(2, len(during) // CHECKPOINT_EVERY - 1), "the outage covered too few checkpoints"
    assert trainer_token not in log.read_text()
    print(
        f"\n{len(during)} steps trained during the {OUTAGE_S:.0f} s outage ({len(before)} in the {usual:.3f} s steps "
        f"before it); {len(events)} events stored, {len(in_outage)} of them reported during the outage"
    )


def last_step(metrics: Path) -> int:
    return int(json.loads(metrics.read_text().splitlines()[-1])["step"])


def checkpoints(events: list[dict[str, Any]]) -> int:
    """The highest step with a checkpoint_saved event."""
    return max((int(e["step"]) for e in events if e["type"] == "checkpoint_saved"), default=0)


def reported_step(admin: httpx.Client, job_id: str) -> int:
    try:
        ranks = admin.get(f"/v1/jobs/{job_id}/ranks").json()
    except httpx.TransportError:
        return -1
    return max((r["step"] for r in ranks), default=-1)


def all_events(admin: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = "0"
    while cursor is not None:
        page = admin.get(f"/v1/jobs/{job_id}/events", params={"cursor": cursor, "limit": 1000}).json()
        out += page["items"]
        cursor = page["next_cursor"]
    return out
