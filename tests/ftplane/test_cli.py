"""The CLI against a real `ftplane serve` (API + worker + beat in one command, embedded defaults)."""

from __future__ import annotations

import json
import os
import resource
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from ftplane.devserver import ROOT
from ftplane.serve import LISTEN_BACKLOG
from tests.conftest import ftplane_server


def ftplane(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "ftplane.cli", *args],
        env=env,
        cwd=env["WORKDIR"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert result.returncode == 0, result.stderr + result.stdout
    return result


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with ftplane_server(tmp_path_factory.mktemp("serve")) as env:
        yield env


def test_serve_serves_docs_and_saves_an_admin_token(served: dict[str, str]) -> None:
    assert httpx.get(f"{served['FTPLANE_URL']}/docs").status_code == 200
    token_file = Path(served["WORKDIR"]) / ".ftplane" / "admin-token"
    assert token_file.stat().st_mode & 0o077 == 0


def test_serve_completes_a_whole_jobs_connects_while_its_processes_are_stalled(served: dict[str, str]) -> None:
    """Every agent of a job connects at its start and after a restart (16,384 of them at 131,072 GPUs), while the
    API's workers may be busy: the kernel completes connects into the listen backlog until they accept. Here every
    process of the server is stopped outright: the connects that complete are the backlog (uvicorn's default, 2,048,
    overflowed in the scale story), up to the kernel's cap, net.core.somaxconn."""
    port = served["FTPLANE_PORT"]
    expected = min(LISTEN_BACKLOG, int(Path("/proc/sys/net/core/somaxconn").read_text())) + 1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, expected + 1024)), hard))
    server = [p for p in psutil.process_iter() if p.pid != os.getpid() and _environ(p).get("FTPLANE_PORT") == port]
    assert server, "no process of the server found"
    sockets: dict[int, socket.socket] = {}
    for process in server:
        process.suspend()
    try:
        poller = select.poll()
        for _ in range(expected + 256):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", int(port)))
            sockets[sock.fileno()] = sock
            poller.register(sock, select.POLLOUT)
        completed: set[int] = set()
        deadline = time.monotonic() + 10
        while len(completed) < expected and time.monotonic() < deadline:
            for fd, _ in poller.poll(100):  # writable: connected, or failed (then SO_ERROR says why)
                poller.unregister(fd)
                if not sockets[fd].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                    completed.add(fd)
        assert len(completed) >= expected, f"{len(completed)} connects completed with the server stopped"
    finally:
        for process in server:
            process.resume()
        for sock in sockets.values():
            sock.close()
    assert httpx.get(f"{served['FTPLANE_URL']}/healthz").status_code == 200


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return {}


def test_serve_starts_its_worker_again_when_it_dies(tmp_path: Path) -> None:
    """The worker (with beat) that `ftplane serve` runs beside the API, killed outright, is started again, and it
    supervises: a job submitted after it died leaves PENDING."""
    with ftplane_server(tmp_path) as env:
        killed = _worker_of(env)
        assert killed is not None, "no worker process of the server found"
        killed.kill()
        deadline = time.monotonic() + 60
        while (worker := _worker_of(env)) is None or worker.pid == killed.pid:
            assert time.monotonic() < deadline, "the worker was not started again"
            time.sleep(0.2)
        spec = tmp_path / "job.yaml"
        spec.write_text(
            "name: after-worker-died\ncommand: [python, -c, 'import time; time.sleep(30)']\nprocs_per_node: 1\n"
        )
        job_id = json.loads(ftplane(env, "submit", "-f", str(spec), "-o", "json").stdout)["id"]
        while json.loads(ftplane(env, "describe", "job", job_id, "-o", "json").stdout)["status"] == "PENDING":
            assert time.monotonic() < deadline, "the job was never launched"
            time.sleep(0.3)
        ftplane(env, "cancel", job_id)
        ftplane(env, "events", job_id, "--follow")  # returns once the job ends


def _worker_of(env: dict[str, str]) -> psutil.Process | None:
    """The server's live Celery worker process (`python -P -m workers worker ...`)."""
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        live = process.info["status"] != psutil.STATUS_ZOMBIE
        if (
            live
            and cmdline[2:5] == ["-m", "workers", "worker"]
            and _environ(process).get("FTPLANE_PORT") == env["FTPLANE_PORT"]
        ):
            return process
    return None


def test_submit_get_describe_events_cancel(served: dict[str, str]) -> None:
    spec = Path(served["WORKDIR"]) / "job.yaml"
    spec.write_text(
        "name: cli-job\ncommand: [python, -c, 'import time; time.sleep(30)']\nprocs_per_node: 1\nlabels: {team: cli}\n"
    )
    submitted = json.loads(ftplane(served, "submit", "-f", str(spec), "-o", "json").stdout)
    job_id = submitted["id"]
    listed = json.loads(ftplane(served, "get", "jobs", "-o", "json").stdout)
    assert job_id in [j["id"] for j in listed["items"]]
    assert job_id[:8] in ftplane(served, "get", "jobs").stdout
    described = ftplane(served, "describe", "job", job_id).stdout
    assert "cli-job" in described and "max_in_job_restarts" in described
    deadline = time.monotonic() + 60
    while json.loads(ftplane(served, "describe", "job", job_id, "-o", "json").stdout)["status"] == "PENDING":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    cancelled = json.loads(ftplane(served, "cancel", job_id, "-o", "json").stdout)
    assert cancelled["cancel_requested"] or cancelled["status"] == "CANCELLED"
    followed = ftplane(served, "events", job_id, "--follow", "-o", "json").stdout  # returns once the job ends
    types = [json.loads(line)["type"] for line in followed.splitlines()]
    assert types[0] == "submitted" and "cancelled" in types, types
    # The ranks the cancel stopped may be reported by their node after the control plane recorded it.
    after = types[types.index("cancelled") + 1 :]
    assert set(after) <= {"rank_failed"}, types


def test_invalid_spec_is_refused_with_the_field(served: dict[str, str]) -> None:
    spec = Path(served["WORKDIR"]) / "bad.yaml"
    spec.write_text("name: bad\ncommand: [python]\nprocs_per_node: 2\nnodez: 3\n")
    result = ftplane(served, "submit", "-f", str(spec), check=False)
    assert result.returncode == 1
    assert "nodez" in result.stderr and "unknown field" in result.stderr


def test_render_local_spec(served: dict[str, str]) -> None:
    out = ftplane(served, "render", "-f", str(ROOT / "examples" / "tiny-local.yaml")).stdout
    assert "ft_launcher" in out and "--nproc-per-node=2" in out and "FTPLANE_CHECKPOINT_ENGINE=async" in out


def test_token_create_prints_a_working_token(served: dict[str, str]) -> None:
    created = json.loads(ftplane(served, "token", "create", "--name", "ci", "-o", "json").stdout)
    response = httpx.get(f"{served['FTPLANE_URL']}/v1/jobs", headers={"Authorization": f"Bearer {created['token']}"})
    assert response.status_code == 200


def test_projects_project_tokens_and_the_audit_log(served: dict[str, str]) -> None:
    """A cluster admin makes a project and binds a group; `token create --project P --role operator` makes a
    token that submits there and nowhere else; `ftplane audit` lists who did what."""
    assert "project vision created" in ftplane(served, "project", "create", "vision", "--gpu-limit", "16").stdout
    listed = json.loads(ftplane(served, "project", "list", "--json").stdout)
    assert {p["name"]: p["gpu_limit"] for p in listed} == {"default": None, "vision": 16}
    bound = json.loads(
        ftplane(served, "project", "bind", "vision", "--group", "cv", "--role", "viewer", "--json").stdout
    )
    assert (bound["kind"], bound["value"], bound["role"]) == ("group", "cv", "viewer")
    made = ftplane(
        served, "token", "create", "--name", "cv-ops", "--project", "vision", "--role", "operator", "-o", "json"
    )
    operator = json.loads(made.stdout)
    assert (operator["project"], operator["role"]) == ("vision", "operator")
    as_operator = {**served, "FTPLANE_TOKEN": operator["token"]}
    spec = Path(served["WORKDIR"]) / "vision.yaml"
    spec.write_text("name: cv-job\nproject: vision\ncommand: [python, -c, pass]\n")
    job = json.loads(ftplane(as_operator, "submit", "-f", str(spec), "-o", "json").stdout)
    assert job["project"] == "vision"
    elsewhere = Path(served["WORKDIR"]) / "default.yaml"
    elsewhere.write_text("name: other\ncommand: [python, -c, pass]\n")
    refused = ftplane(as_operator, "submit", "-f", str(elsewhere), check=False)
    assert refused.returncode != 0 and "unknown project 'default'" in refused.stderr
    unknown = ftplane(served, "token", "create", "--project", "nope", "--role", "viewer", check=False)
    assert unknown.returncode != 0 and "unknown project 'nope'" in unknown.stderr

    entries = json.loads(ftplane(served, "audit", "--project", "vision", "--json").stdout)
    assert [(e["action"], e["outcome"]) for e in entries] == [
        ("POST /v1/projects", 201),
        ("POST /v1/projects/{project}/bindings", 201),
        ("ftplane token create", 201),
        ("POST /v1/jobs", 201),
    ]
    made_here = entries[2]
    assert (made_here["actor_kind"], made_here["object_id"]) == ("host", operator["id"])
    assert made_here["actor"].startswith("host:") and made_here["details"] == {"name": "cv-ops", "role": "operator"}
    assert entries[-1]["actor_name"] == "cv-ops" and entries[-1]["object_id"] == job["id"]
    table = ftplane(served, "audit", "--actor", "cv-ops").stdout
    assert "POST /v1/jobs" in table and "422" in table  # the refused submission to `default` too
