"""End to end, on embedded defaults: one zero-code job under real node agents and ft_launcher, launched by a real
`ftplane serve`. Its ranks print known lines, a secret (the spec's `secret_env`, from a variable of the server's
host) and a token; in attempt 0 they run a gloo allreduce per line, and rank 1 raises a known exception after one,
in each launcher cycle, so rank 0's next allreduce breaks (`Connection closed by peer`): the launcher restarts them
in place once, gives up, and the control plane restarts the job, whose short attempt 1 succeeds. One job shows:
the exception in rank 1's `rank_failed` tail, named in its cause and in the causes of the in-job and job restarts
(and in their webhooks, and `ftplane describe`), whichever rank the launcher names first, rank 0's broken
collective marked a consequence; the lines per rank and attempt through the API and `ftplane logs`; a followed
line within 2 s of its printing; the status RUNNING while the short attempt runs; and the secret nowhere: not in
an event, a log response or a webhook."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from ftplane.client import Client
from tests.conftest import ftplane_server
from tests.support.receivers import Receiver
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

SECRET = "s3cr3t-Value-of-the-job"
TOKEN = "ftp_job_" + "L0gsT0k3n" * 5
EXCEPTION = "ValueError: known failure 42"
PEER_GONE = "Connection closed by peer"
GO = "attempt-1-may-end"  # attempt 1's ranks run until the test, having seen the job RUNNING, writes this file
RUNNING_BOUND_S = 5.0  # RUNNING within one report interval and a second of the ranks being up; here with margin

RANKS = f"""
import os, signal, time
rank = int(os.environ["RANK"])
attempt = os.environ["FTPLANE_ATTEMPT"]
cycle = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
print(f"rank {{rank}} attempt {{attempt}} cycle {{cycle}} starts", flush=True)
if rank == 0:
    print("the secret is " + os.environ["LOGS_E2E_TOKEN"] + " and a token {TOKEN}", flush=True)
if attempt == "0":
    import torch
    import torch.distributed as dist
    # Each rank ends of itself (the launcher's teardown SIGTERM is ignored): rank 1 of its exception, rank 0 of its
    # broken collective, both with status 1, whichever the launcher sees first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.init_process_group("gloo")
    ones = torch.ones(1)
    fails_at = time.time() + (12 if cycle == "0" else 2)
    try:
        while True:  # lines to follow, an allreduce each, until rank 1 fails
            dist.all_reduce(ones)
            if rank == 1 and time.time() > fails_at:  # its traceback the last it prints
                raise ValueError("known failure 42")
            print(f"tick {{time.time():.3f}}", flush=True)
            time.sleep(0.25)
    finally:
        dist.destroy_process_group()
while not os.path.exists({{GO!r}}):  # attempt 1: short, but running until the test has seen it RUNNING
    time.sleep(0.1)
print(f"rank {{rank}} attempt {{attempt}} done", flush=True)
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    workdir = tmp_path_factory.mktemp("logs")
    # A variable of the server's host, given to the ranks by the spec's secret_env (the local backend's Secrets).
    with ftplane_server(workdir, FTPLANE_WEBHOOK_ALLOW_PRIVATE="true", LOGS_E2E_SECRET=SECRET) as env:
        (workdir / "ranks.py").write_text(RANKS.replace("{GO!r}", repr(str(workdir / GO))))
        yield env


@pytest.fixture(scope="module")
def api(served: dict[str, str]) -> Iterator[Client]:
    client = Client(url=served["FTPLANE_URL"], token=served["FTPLANE_TOKEN"])
    yield client
    client.close()


def wait(what: str, condition: Callable[[], Any], timeout: float = 150) -> Any:
    return wait_for(what, condition, timeout, interval=0.3)


def events(api: Client, job_id: str, type_: str) -> list[dict[str, Any]]:
    return [e for e in api.all_events(job_id) if e["type"] == type_]


def log_lines(api: Client, job_id: str, **params: Any) -> list[dict[str, Any]]:
    with api.logs(job_id, **params) as response:
        return [json.loads(line) for line in response.iter_lines() if line]


def cli(served: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "ftplane.cli", *args], env=served, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def follow_a_tick(api: Client, job_id: str) -> float:
    """Follow rank 0 and return how long after its printing the first new tick arrived."""
    latency: list[float] = []

    def read() -> None:
        with api.logs(job_id, rank=0, follow="true", tail=0) as response:
            for text in response.iter_lines():
                if text and json.loads(text)["line"].startswith("tick "):
                    latency.append(time.time() - float(json.loads(text)["line"].split()[1]))
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert latency, "no tick followed within 20 s"
    return latency[0]


def test_one_failing_job_shows_its_lines_its_failure_and_never_its_secret(
    api: Client, served: dict[str, str], receiver: Receiver
) -> None:
    hook = api.request("POST", "/v1/webhooks", json={"url": f"{receiver.url}/logs", "label_selector": {"e2e": "logs"}})
    job = api.submit(
        {
            "name": "logs",
            "command": ["python", f"{served['WORKDIR']}/ranks.py"],
            "procs_per_node": 2,
            "env": {"OMP_NUM_THREADS": "1"},
            "secret_env": {"LOGS_E2E_TOKEN": {"secret": "logs-e2e", "key": "LOGS_E2E_SECRET"}},
            "resiliency": {
                "max_in_job_restarts": 1,
                "max_job_restarts": 1,
                "initial_heartbeat_timeout_s": 120,
                "heartbeat_timeout_s": 60,
            },
            "labels": {"e2e": "logs"},
        }
    )
    job_id = job["id"]
    wait("rank 0's ticks", lambda: any(x["line"].startswith("tick") for x in log_lines(api, job_id, rank=0, tail=5)))
    assert follow_a_tick(api, job_id) < 2.0  # printed, kept on the node, read and streamed within 2 s

    # Attempt 1 is short, and RUNNING while it runs: within the bound of its ranks being up (they wait for the test).
    running_at = wait_for(
        "attempt 1 RUNNING",
        lambda: (j := api.job(job_id))["attempt"] == 1 and j["status"] == "RUNNING" and time.time(),
        240,
        interval=0.1,
    )
    starts = wait("attempt 1's first line", lambda: log_lines(api, job_id, attempt=1, rank=0, tail=10))[0]
    assert starts["line"] == "rank 0 attempt 1 cycle 0 starts"
    up = datetime.fromisoformat(starts["ts"].replace("Z", "+00:00")).timestamp()
    assert running_at - up <= RUNNING_BOUND_S, f"RUNNING {running_at - up:.1f} s after the ranks were up"
    assert not any("done" in x["line"] for x in log_lines(api, job_id, attempt=1))  # they are still running
    (Path(served["WORKDIR"]) / GO).touch()
    done = wait("the job to end", lambda: (j := api.job(job_id))["status"] in ("SUCCEEDED", "FAILED") and j, 120)
    assert done["status"] == "SUCCEEDED" and done["attempt"] == 1, done

    # The exception travels with rank 1's failure, and into the causes of both restarts, whichever rank the launcher
    # named first; rank 0's broken collective is marked its consequence. (The launcher names every failure of a round
    # only as it gives up: rank 1's of the first cycle may go unnamed.)
    failed = events(api, job_id, "rank_failed")
    raised = [e for e in failed if e["rank"] == 1]
    broken = [e for e in failed if e["rank"] == 0]
    assert 1 <= len(raised) <= 2 and broken and all(e["attempt"] == 0 for e in failed), failed
    for failure in raised:
        details = failure["details"]
        assert details["cause_class"] == "exception" and details["exception"] == EXCEPTION
        assert details["cause"] == f"raised {EXCEPTION} (exit code 1)" and "consequence" not in details
        assert (
            details["tail"].splitlines()[-1].endswith(EXCEPTION)
            and "Traceback (most recent call last):" in (details["tail"])
        )
    for failure in broken:
        details = failure["details"]
        assert details["consequence"] is True and PEER_GONE in details["exception"], details
    (injob,) = events(api, job_id, "injob_restart")
    (restart,) = events(api, job_id, "job_restart")
    assert injob["details"]["rank"] == 1 and "consequence" not in injob["details"]
    for cause in (injob["details"], restart["details"]):
        assert EXCEPTION in cause["cause"] and cause["tail"].splitlines()[-1].endswith(EXCEPTION), cause
        assert PEER_GONE not in cause["cause"]
    assert restart["details"]["cause_class"] == "exception"

    # Lines per rank and attempt, from the API and the CLI.
    first = log_lines(api, job_id, attempt=0, rank=1)
    assert [x["line"] for x in first if "starts" in x["line"]] == [
        "rank 1 attempt 0 cycle 0 starts",
        "rank 1 attempt 0 cycle 1 starts",
    ]
    assert [x["cycle"] for x in first if x["line"].endswith(EXCEPTION)] == [0, 1]
    second = log_lines(api, job_id)  # the newest attempt by default
    assert {(x["rank"], x["attempt"], x["line"]) for x in second if "done" in x["line"]} == {
        (0, 1, "rank 0 attempt 1 done"),
        (1, 1, "rank 1 attempt 1 done"),
    }
    printed = cli(served, "logs", job_id, "--attempt", "0", "--rank", "1", "--tail", "3")
    assert printed.splitlines()[-1].endswith(EXCEPTION) and len(printed.splitlines()) == 3
    assert "[rank0] rank 0 attempt 1 done" in cli(served, "logs", job_id).splitlines()
    assert EXCEPTION in cli(served, "describe", "job", job_id)

    # The webhooks of the restarts carry the tail.
    received = receiver.wait_for("/logs", 3, timeout=30)  # injob_restart, job_restart, succeeded
    payloads = [Webhook(hook["secret"]).verify(got.body, got.headers) for got in received]
    restarts = [p for p in payloads if p["type"] in ("injob_restart", "job_restart")]
    assert len(restarts) == 2 and all(EXCEPTION in p["data"]["event"]["details"]["tail"] for p in restarts)

    # The secret and the token were printed, and left the node redacted only.
    lines = log_lines(api, job_id, attempt=0, rank=0) + log_lines(api, job_id, attempt=1)
    assert any(x["line"] == "the secret is *** and a token ***" for x in lines)
    text = httpx.get(
        f"{served['FTPLANE_URL']}/v1/jobs/{job_id}/logs",
        params={"attempt": 0},
        headers={"Authorization": f"Bearer {served['FTPLANE_TOKEN']}", "Accept": "text/plain"},
    ).text
    everything = json.dumps(api.all_events(job_id)) + json.dumps(lines) + text
    everything += "".join(got.body.decode() for got in receiver.at("/logs"))
    assert "*** and a token ***" in everything
    assert SECRET not in everything and TOKEN not in everything
