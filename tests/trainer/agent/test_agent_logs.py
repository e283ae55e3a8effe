"""The node agent keeps each rank's output for real (ft_launcher's tee, NVRx 0.4.1 on CPU): within its bound,
ft_launcher's own copies given back, secrets redacted, and a failed rank's last lines in its `rank_failed`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ftplane import contract
from tests.support.waiting import wait_for
from tests.trainer.agent.conftest import events, launcher_command, submitted_job

SECRET = "hf_Sup3rSecretValue"
TOKEN = "ftp_admin_" + "T0k3n" * 9

SCRIPT = f"""
import os, sys, time
rank = int(os.environ["RANK"])
if rank == 0:
    filler = "x" * 100
    for n in range(30000):  # ~3.4 MB, past a 1 MiB bound
        print(f"line {{n}} {{filler}}")
    sys.stdout.flush()
    time.sleep(30)
else:
    print("known line one", flush=True)
    print("the secret is " + os.environ["HF_TOKEN"] + " and a token {TOKEN}", flush=True)
    while not os.path.exists(os.environ["GO"]):  # the test says when (once it has seen the copy given back)
        time.sleep(0.05)
    raise ValueError("known failure 42")
"""


def disk_use(path: Path) -> int:
    return path.stat().st_blocks * 512


def written(copies: Path) -> list[Path]:
    """ft_launcher's copy of rank 0's output, once it holds everything the rank printed."""
    return [p for p in copies.rglob("0/stdout.log") if p.stat().st_size > 3_000_000]


def test_a_rank_past_the_bound_a_secret_and_an_exception(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    job = submitted_job(admin, make_job)
    command = launcher_command(tmp_path, script=SCRIPT, max_restarts=0)
    copies = tmp_path / "launcher-copies"
    command.insert(command.index("--tee=3") + 1, f"--log-dir={copies}")
    agent = start_agent(
        live,
        job,
        command,
        HF_TOKEN=SECRET,
        FTPLANE_SECRET_ENV="HF_TOKEN",
        FTPLANE_LOG_MAX_BYTES=str(contract.LOG_MIN_BYTES),
        FTPLANE_AGENT_ECHO="1",
        GO=str(tmp_path / "go"),
    )
    # ft_launcher's own copy of rank 0's output: its length is all it printed, its disk use what is not given back
    (teed,) = wait_for("rank 0's copy written", lambda: written(copies), 60)
    wait_for("the copy given back", lambda: disk_use(teed) < 1.25 * 1024 * 1024, 60, interval=0.1)
    (tmp_path / "go").touch()
    assert agent.wait(120) != 0

    failed = {e["rank"]: e for e in events(admin, job["id"], "rank_failed")}
    details = failed[1]["details"]
    assert details["cause_class"] == "exception" and details["exception"] == "ValueError: known failure 42"
    assert details["cause"] == "raised ValueError: known failure 42 (exit code 1)"
    tail = details["tail"].splitlines()
    assert tail[0] == "known line one" and tail[-1] == "ValueError: known failure 42"
    assert "Traceback (most recent call last):" in tail and "the secret is *** and a token ***" in tail

    logs = agent.run_dir / contract.LOG_DIR
    kept = sorted(p.name for p in logs.iterdir())
    assert kept == ["rank0.jsonl", "rank0.jsonl.1", "rank1.jsonl"]
    assert sum(p.stat().st_size for p in logs.glob("rank0.*")) <= contract.LOG_MIN_BYTES
    last = contract.read_log_record((logs / "rank0.jsonl").read_text().splitlines()[-1])
    assert last is not None and last["line"].startswith("line 29999 ")  # the newest lines are the ones kept

    everything = "".join(p.read_text(errors="replace") for p in agent.run_dir.rglob("*") if p.is_file())
    everything += agent.output() + str(events(admin, job["id"]))
    assert "known failure 42" in everything and SECRET not in everything and TOKEN not in everything
