"""Crash safety of the worker: kill -9 the Celery worker while it launches, supervises and delivers. Nothing
is lost, nothing is done twice. (The API's side, batches acknowledged while it is killed: test_api_crash_safety.py.)

Real processes throughout: a Celery worker (with beat) on the real Redis broker, jobs launched by
the local backend under real ft_launcher, an API on PostgreSQL. The worker dies at named kill
points (`api/core/killpoints.py`: `FTPLANE_TEST_KILL_AT`), each inside the window it is named for;
the test checks what the dead worker left before starting the next one. Assertions are on the
database: one launch per attempt, unique events, every job at its terminal state, every webhook
delivery delivered, the interrupted one twice with the same webhook-id (the others once per recorded try).
A launch whose record the dead worker never wrote is adopted, not repeated.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from tests.conftest import REDIS_URL, configure_env, require
from tests.reliability.conftest import ApiProcess, worker_process
from tests.support.processes import CeleryWorker
from tests.support.receivers import Receiver
from tests.support.waiting import wait_for

END = {"SUCCEEDED", "FAILED", "CANCELLED"}

# Each job's one process records its start, then waits for its flag file: the test decides when a job ends.
TRAINER = (
    "import os, sys, time; job = os.environ['FTPLANE_JOB_ID']; "
    "open(sys.argv[1], 'a').write(job + ' a' + os.environ['FTPLANE_ATTEMPT'] + '\\n'); "
    "flag = os.path.join(sys.argv[2], job)\n"
    "while not os.path.exists(flag): time.sleep(0.1)"
)


class KilledWorker:
    """Starts the worker set to die at one kill point, and reads the marker it leaves."""

    def __init__(self, worker: CeleryWorker, markers: Path) -> None:
        self.worker = worker
        self.markers = markers
        worker.env["FTPLANE_TEST_KILL_LOG"] = str(markers)

    def start(self, kill_at: str | None) -> None:
        if kill_at:
            self.worker.env["FTPLANE_TEST_KILL_AT"] = kill_at
        else:
            self.worker.env.pop("FTPLANE_TEST_KILL_AT", None)
        self.worker.start()

    def died_at(self, point: str, timeout: float = 90) -> dict[str, Any]:
        """Waits for the worker to die at `point`; returns the marker it wrote just before."""
        process = self.worker.process
        assert process is not None
        found = wait_for(f"the worker to die at {point}", lambda: self._marker(point), timeout, interval=0.05)
        assert process.wait(30) == -signal.SIGKILL, "the worker did not die by SIGKILL"
        self.worker.process = None
        return dict(found)

    def _marker(self, point: str) -> dict[str, Any] | None:
        lines = self.markers.read_text().splitlines() if self.markers.exists() else []
        found = [json.loads(line) for line in lines if json.loads(line)["point"] == point]
        return found[-1] if found else None


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.postgres
def test_worker_killed_while_launching_supervising_and_delivering(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, receiver: Receiver
) -> None:
    settings = {
        "FTPLANE_REDIS_URL": require(REDIS_URL, "FTPLANE_TEST_REDIS_URL"),
        "FTPLANE_QUEUE": f"ftplane-crash-{uuid.uuid4().hex[:8]}",
        "FTPLANE_SUPERVISE_INTERVAL_S": "0.5",
        "FTPLANE_WEBHOOK_ALLOW_PRIVATE": "true",
        # A delivery held by a dead worker is swept after its lease (8 x 1 s + 30 s) and the sweep's 15 s grace.
        "FTPLANE_WEBHOOK_TIMEOUT_S": "1",
    }
    data_dir = tmp_path / "state"
    configure_env(monkeypatch, data_dir, postgres_url, **settings)
    from api.core.db import session_scope
    from api.database.tables import ApiToken, Attempt, Event, Job, WebhookDelivery
    from api.main import create_app
    from api.models import tokens
    from api.schemas.spec import JobSpec
    from workers.backends.local import LocalBackend

    app = create_app()
    with session_scope() as session:
        _, token = tokens.create_admin(session, "tests")
    admin = TestClient(app, headers={"Authorization": f"Bearer {token}"})
    backend = LocalBackend(runs_dir=data_dir / "runs")
    flags = tmp_path / "flags"
    flags.mkdir()
    starts = tmp_path / "starts.log"  # each trainer process that starts appends a line here
    # The API the jobs' node agents report to (the test itself calls the app in process).
    api = ApiProcess(tmp_path / "api", {"FTPLANE_DATABASE_URL": postgres_url, "FTPLANE_DATA_DIR": str(data_dir)})
    worker_env = {**settings, "FTPLANE_DATA_DIR": str(data_dir), "FTPLANE_DATABASE_URL": postgres_url}
    worker_env["FTPLANE_PUBLIC_URL"] = api.url
    worker = KilledWorker(worker_process(worker_env, tmp_path / "worker.log"), tmp_path / "killed.jsonl")

    def node(job_id: str) -> Any:
        return backend.nodes(job_id, 0, JobSpec(name="crash", command=["true"]))[0]

    def status(job_id: str) -> str:
        return str(admin.get(f"/v1/jobs/{job_id}").json()["status"])

    def attempt_status(job_id: str) -> str:
        return str(admin.get(f"/v1/jobs/{job_id}").json()["attempts"][0]["status"])

    def events_of(job_id: str, type_: str) -> int:
        with session_scope() as session:
            query = select(func.count()).select_from(Event).where(Event.job_id == job_id, Event.type == type_)
            return int(session.scalar(query) or 0)

    api.start()
    try:
        subscription = {"url": f"{receiver.url}/hook", "event_types": ["submitted", "succeeded"]}
        hook = admin.post("/v1/webhooks", json=subscription)
        assert hook.status_code == 201, hook.text
        spec = {
            "command": ["python", "-c", TRAINER, str(starts), str(flags)],
            "procs_per_node": 1,
            "resiliency": {"max_in_job_restarts": 0, "max_job_restarts": 1},
        }
        jobs = [admin.post("/v1/jobs", json={**spec, "name": f"crash-{i}"}).json()["id"] for i in range(3)]

        # 1. Killed while launching: the attempt's processes started, its trainer token committed,
        #    the launch not recorded.
        worker.start("launch.started")
        killed = worker.died_at("launch.started")
        launched = killed["job"]
        assert killed["attempt"] == 0 and launched in jobs
        with session_scope() as session:
            attempt = session.scalars(select(Attempt).where(Attempt.job_id == launched)).one()
            assert attempt.status == "PENDING", "the launch was recorded before the kill"
            names = set(session.scalars(select(ApiToken.name).where(ApiToken.job_id == launched)))
            assert f"trainer:crash-{jobs.index(launched)}:a0" in names, names
        assert node(launched).launched() is not None, "the backend had not started the attempt"

        # 2. Killed while supervising: the reconcile pass ended a job's attempt (its process exited 0)
        #    in its transaction, and died before the commit.
        worker.start("reconcile.ended")
        wait_for("every job's attempt to run", lambda: all(attempt_status(j) == "RUNNING" for j in jobs), 90)
        ending = jobs[0]
        (flags / ending).touch()
        killed = worker.died_at("reconcile.ended")
        assert killed["job"] == ending and killed["attempt"] == 0
        assert node(ending).exit_code() == 0
        assert attempt_status(ending) == "RUNNING" and status(ending) not in END, "the end was committed"
        assert events_of(ending, "succeeded") == 0, "the end was committed"
        sent = [r.json() for r in receiver.requests]
        assert not [m for m in sent if m["type"] == "succeeded"], "a webhook announced an end never committed"

        # 3. Killed while delivering: a webhook POST was answered (200), its outcome not recorded.
        worker.start("webhook.posted")
        killed = worker.died_at("webhook.posted")
        delivery = killed["delivery"]
        assert killed["status"] == 200
        assert [r.webhook_id for r in receiver.requests].count(delivery) == 1
        with session_scope() as session:
            row = session.get(WebhookDelivery, delivery)
            assert row is not None and row.status == "pending" and row.attempts == 1

        # 4. A worker that is not killed: every job ends, every delivery is delivered.
        worker.start(None)
        for job_id in jobs:
            (flags / job_id).touch()
        for job_id in jobs:
            wait_for(f"job {job_id} to end", lambda j=job_id: status(j) in END, 90)
        wait_for("every webhook delivery to be delivered", lambda: pending_deliveries() == 0, 100, interval=0.5)
    finally:
        for job_id in admin.get("/v1/jobs").json()["items"]:
            (flags / job_id["id"]).touch()
        worker.worker.stop()
        api.kill(signal.SIGTERM)

    # Every job is supervised again after the restarts and reaches its end, launched once.
    launches = collections.Counter(starts.read_text().split("\n")[:-1])
    with session_scope() as session:
        for job_id in jobs:
            job = session.get(Job, job_id)
            assert job is not None and job.status == "SUCCEEDED", (job_id, job and job.status_reason)
            attempts = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).all()
            assert [(a.number, a.status) for a in attempts] == [(0, "SUCCEEDED")]
            assert launches[f"{job_id} a0"] == 1, f"attempt 0 of {job_id} was launched {launches[f'{job_id} a0']} times"
            types = collections.Counter(session.scalars(select(Event.type).where(Event.job_id == job_id)))
            assert types["submitted"] == 1 and types["succeeded"] == 1, types
            assert all(n == 1 for n in types.values()), f"an event of {job_id} was recorded twice: {types}"
        # One delivery per (subscription, event), each delivered.
        rows = session.execute(
            select(WebhookDelivery.event_id, WebhookDelivery.status, WebhookDelivery.id, WebhookDelivery.attempts)
        ).all()
        events = session.scalar(
            select(func.count()).select_from(Event).where(Event.type.in_(["submitted", "succeeded"]))
        )
    assert len(rows) == events == 2 * len(jobs)
    assert len({r.event_id for r in rows}) == len(rows) and {r.status for r in rows} == {"delivered"}
    # The receiver got the interrupted delivery twice, with the same webhook-id, and every other one once per try
    # the outbox recorded: once, unless the loaded machine answered a try after its timeout, which is then retried.
    received = collections.Counter(r.webhook_id for r in receiver.requests)
    assert set(received) == {r.id for r in rows}, received
    tries = {r.id: r.attempts for r in rows}
    assert 2 <= received[delivery] <= tries[delivery], (received, tries)
    assert all(1 <= received[i] <= tries[i] for i in tries), (received, tries)
    assert worker.worker.starts == 4
    print(
        f"\n3 kill -9 of the worker, each at its point (launch.started, reconcile.ended, webhook.posted), "
        f"survived; {len(rows)} deliveries, {sum(received.values()) - len(rows)} sent twice (same webhook-id)"
    )


def pending_deliveries() -> int:
    from api.core.db import session_scope
    from api.database.tables import WebhookDelivery

    with session_scope() as session:
        return int(
            session.scalar(
                select(func.count()).select_from(WebhookDelivery).where(WebhookDelivery.status != "delivered")
            )
            or 0
        )


def test_a_kill_point_is_off_unless_named_and_kills_its_process_group_when_named(tmp_path: Path) -> None:
    """The hook itself: nothing happens at a point the variable does not name; at a named one the
    process writes its marker and dies by SIGKILL with its group (here a child of the hooked process)."""
    import subprocess

    code = (
        "import subprocess, sys, time\n"
        "from api.core.killpoints import kill_point\n"
        "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], **quiet)\n"
        "print(child.pid, flush=True)\n"
        "kill_point('elsewhere', job='j')\n"
        "print('passed elsewhere', flush=True)\n"
        "kill_point('here', job='j', attempt=0)\n"
        "print('survived', flush=True)\n"
    )
    log = tmp_path / "killed.jsonl"
    env = {"FTPLANE_TEST_KILL_AT": "before,here", "FTPLANE_TEST_KILL_LOG": str(log), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, start_new_session=True
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    child, passed = done.stdout.split("\n")[:2]
    assert passed == "passed elsewhere" and "survived" not in done.stdout
    (marker,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (marker["point"], marker["job"], marker["attempt"]) == ("here", "j", 0)
    wait_for("the group's other process to die", lambda: not Path(f"/proc/{child}").exists(), 10, interval=0.05)
    unset = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    os.kill(int(unset.stdout.split()[0]), signal.SIGKILL)  # its sleeping child, left behind by design
    assert unset.returncode == 0 and unset.stdout.endswith("survived\n")


def _runners(state_dir: Path) -> list[int]:
    wanted = [b"-m", b"workers.backends.local_runner", str(state_dir).encode()]
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes().split(b"\0")[1:4] == wanted:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.mark.parametrize("runner_state", ["running", "ended"])
def test_a_launch_whose_record_was_lost_is_adopted_not_repeated(tmp_path: Path, runner_state: str) -> None:
    """A window inside the backend's launch, made certain: the worker started a node's runner and was
    killed before writing its launch.json. The launch, run again, must not start it twice."""
    import subprocess
    import sys

    from api.schemas.spec import JobSpec
    from workers.backends.base import AttemptPhase, LaunchRequest
    from workers.backends.local import LocalBackend, runner_of

    backend = LocalBackend(runs_dir=tmp_path / "runs")
    spec = JobSpec(name="adopt", command=["sleep", "30"])
    request = LaunchRequest(job_id="j1", attempt=0, spec=spec, token="t", control_plane_url="http://127.0.0.1:9")
    run = backend.nodes("j1", 0, spec)[0]
    run.path.mkdir(parents=True)
    command = ["sleep", "30"] if runner_state == "running" else ["true"]
    runner = subprocess.Popen(
        [sys.executable, "-m", "workers.backends.local_runner", str(run.path), "--", *command],
        start_new_session=True,
    )
    try:
        if runner_state == "running":
            wait_for("the runner to start", lambda: runner_of(run.path) == runner.pid, 10, interval=0.01)
        else:
            runner.wait(10)
        backend.launch(request)  # the launch again, by the next worker
        record = run.launched()
        assert record is not None and record.get("adopted") is True
        status = backend.status("j1", 0, spec)
        if runner_state == "running":
            assert record["pid"] == runner.pid and status.phase == AttemptPhase.running
            assert _runners(run.path) == [runner.pid], "a second runner was started"
        else:
            assert status.phase == AttemptPhase.succeeded and _runners(run.path) == []
    finally:
        backend.cancel("j1", 0, spec)
        runner.kill()
        runner.wait(10)
