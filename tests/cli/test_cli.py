"""The CLI against a real `ftplane serve` (API + worker + beat in one command, embedded defaults)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ftplane.devserver import ROOT
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
    assert types[0] == "submitted" and types[-1] == "cancelled"


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
