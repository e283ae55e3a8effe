"""The local backend runs a real ft_launcher process tree (no control plane needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.schemas.spec import JobSpec
from tests.support.waiting import wait_for
from workers.backends.base import AttemptPhase, AttemptStatus, FaultRequest, LaunchRequest
from workers.backends.local import LocalBackend, process_start_time

WORKER = (
    "import os, sys, time\n"
    "restart = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))\n"
    "deadline = time.time() + float(os.environ.get('RUN_FOR', '60'))\n"
    "while time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
    "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n"
)


def spec(**overrides: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "local-test",
        "command": ["python", "-c", WORKER],
        "procs_per_node": 2,
        "resiliency": {"max_in_job_restarts": 1, "heartbeat_timeout_s": 60, "initial_heartbeat_timeout_s": 60},
    }
    base.update(overrides)
    return JobSpec.model_validate(base)


def launch(backend: LocalBackend, job_spec: JobSpec, job_id: str = "job1") -> LaunchRequest:
    request = LaunchRequest(
        job_id=job_id, attempt=0, spec=job_spec, token="ftp_job_secret", control_plane_url="http://x"
    )
    backend.launch(request)
    return request


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(runs_dir=tmp_path / "runs")


def test_success_and_idempotent_launch(backend: LocalBackend) -> None:
    job_spec = spec(env={"RUN_FOR": "1"})
    launch(backend, job_spec)
    first = backend.attempt_dir("job1", 0).launched()
    launch(backend, job_spec)  # a redelivered launch starts nothing new
    assert backend.attempt_dir("job1", 0).launched() == first
    status = wait_for(
        "end", lambda: (s := backend.status("job1", 0, job_spec)).phase != AttemptPhase.running and s, interval=0.2
    )
    assert isinstance(status, AttemptStatus) and status.phase == AttemptPhase.succeeded
    token_in_log = "ftp_job_secret" in backend.attempt_dir("job1", 0).log_text()
    assert not token_in_log


def test_crash_is_restarted_in_job_then_budget_ends_it(backend: LocalBackend) -> None:
    job_spec = spec()
    launch(backend, job_spec)
    pids = wait_for("rank 1 process", lambda: backend.rank_pids("job1", 0, 1), interval=0.2)
    assert isinstance(pids, list) and len(pids) == 1
    backend.inject_fault("job1", 0, job_spec, FaultRequest(id="f1", kind="crash", rank=1))
    status = wait_for(
        "in-job restart", lambda: (s := backend.status("job1", 0, job_spec)).in_job_restarts == 1 and s, interval=0.2
    )
    assert isinstance(status, AttemptStatus)
    assert status.phase == AttemptPhase.running
    failed = [e for e in status.events if e.type == "rank_failed"]
    assert failed and failed[0].rank == 1 and failed[0].details["cause"] == "killed by SIGKILL"
    new_pids = wait_for("restarted rank 1", lambda: backend.rank_pids("job1", 0, 1), interval=0.2)
    assert new_pids != pids
    backend.inject_fault("job1", 0, job_spec, FaultRequest(id="f2", kind="crash", rank=0))
    ended = wait_for(
        "failure", lambda: (s := backend.status("job1", 0, job_spec)).phase == AttemptPhase.failed and s, interval=0.2
    )
    assert isinstance(ended, AttemptStatus)
    assert ended.cause is not None and "in-job restart budget (1) spent" in ended.cause.message


def test_restarted_worker_readopts_and_cancel_ends_the_tree(backend: LocalBackend, tmp_path: Path) -> None:
    job_spec = spec()
    launch(backend, job_spec)
    wait_for("ranks", lambda: backend.rank_pids("job1", 0, 0) and backend.rank_pids("job1", 0, 1), interval=0.2)
    tree = [*backend.rank_pids("job1", 0, 0), *backend.rank_pids("job1", 0, 1)]
    readopted = LocalBackend(runs_dir=tmp_path / "runs")  # a new worker process, same state on disk
    assert readopted.status("job1", 0, job_spec).phase == AttemptPhase.running
    readopted.inject_fault("job1", 0, job_spec, FaultRequest(id="h", kind="hang", rank=1))  # SIGSTOP
    readopted.cancel("job1", 0, job_spec)
    wait_for("tree to end", lambda: all(process_start_time(p) is None for p in tree), timeout=30, interval=0.2)
    assert readopted.status("job1", 0, job_spec).phase == AttemptPhase.failed
    readopted.cancel("job1", 0, job_spec)  # idempotent


def test_render_hides_the_token(backend: LocalBackend) -> None:
    request = LaunchRequest(job_id="j", attempt=0, spec=spec(), token="ftp_job_secret", control_plane_url="http://x")
    text = backend.render(request)
    assert "ftp_job_secret" not in text and "ft_launcher" in text and "--max-restarts=1" in text
