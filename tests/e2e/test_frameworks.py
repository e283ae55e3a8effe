"""End to end, the frameworks people train with: examples/lightning and examples/transformers, 2 CPU ranks each under
real node agents and ft_launcher, launched and supervised by a real `ftplane serve`. With ftplane's one-line callback
each job has a crash injected on rank 1 mid-run and resumes from its framework's checkpoint; the Lightning script
without ftplane code runs with the `lightning` progress preset. A watcher polls the job's status and its ranks'
processes all along: the status reads RUNNING within one report interval (plus a second) of each round's rank
processes being up."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from ftplane.client import ApiFailure, Client
from tests.conftest import ftplane_server
from tests.e2e.test_byo import events, finished, wait
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

REPORT_INTERVAL_S = 1.0  # a one-node local job's default
POLL_S = 0.1
# The node agent says `running` within one report interval plus a second of the ranks being up.
RUNNING_BOUND_S = REPORT_INTERVAL_S + 1.0
# Its report then reaches the API and turns the status RUNNING, as the watcher (polling) sees it: that path's time
# is the machine's (an HTTP request and a commit, slower on a busy one), bounded loosely; bench.agent measures it.
DELIVERED_BOUND_S = 5.0


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    workdir = tmp_path_factory.mktemp("frameworks")
    with ftplane_server(workdir) as env:
        client = Client(url=env["FTPLANE_URL"], token=env["FTPLANE_TOKEN"])
        client.workdir = workdir  # type: ignore[attr-defined]
        yield client
        client.close()


def spec(name: str, script: str, args: list[str], **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "command": ["python", str(REPO / "examples" / script), *args],
        "procs_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"engine": "none"},  # the framework saves its own checkpoints
        "resiliency": {
            "max_in_job_restarts": 2,
            "max_job_restarts": 0,
            "initial_heartbeat_timeout_s": 120,
            "heartbeat_timeout_s": 30,
        },
    }
    body.update(overrides)
    return body


def _started_at(pid: int) -> float | None:
    """When a process started (seconds since the epoch), from /proc to the clock tick; None once it is gone."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


@dataclass
class Watcher:
    """Polls a job's status and its ranks' processes until it ends: what a user would have seen, and when."""

    api: Client
    job_id: str
    statuses: list[tuple[float, str, int]] = field(default_factory=list)  # (when, status, in-job restarts)
    started: dict[int, float] = field(default_factory=dict)  # rank pid -> when it started
    steps: set[tuple[float, int, int]] = field(default_factory=set)  # (heartbeat time, rank, step) the API showed
    eta_seen: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                job = self.api.job(self.job_id)
                seen = time.time()  # the status as of now: not after the two reads below (slow on a busy machine)
                nodes = self.api.request("GET", f"/v1/jobs/{self.job_id}/nodes")
                ranks = self.api.ranks(self.job_id)
            except ApiFailure:
                time.sleep(POLL_S)
                continue
            self.statuses.append((seen, job["status"], sum(a["in_job_restarts"] for a in job["attempts"])))
            self.eta_seen = self.eta_seen or job["progress"]["eta_s"] is not None
            for rank in (r for n in nodes for r in n["ranks"] if r["alive"]):
                if rank["pid"] not in self.started and (at := _started_at(rank["pid"])) is not None:
                    self.started[rank["pid"]] = at
            self.steps |= {(datetime.fromisoformat(r["last_seen"]).timestamp(), r["rank"], r["step"]) for r in ranks}
            if job["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                return
            time.sleep(POLL_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def rounds(self) -> list[float]:
        """When each round's ranks were all up: rank processes that started within 5 s of each other are a round."""
        ups: list[list[float]] = []
        for at in sorted(self.started.values()):
            if ups and at - ups[-1][0] < 5:
                ups[-1].append(at)
            else:
                ups.append([at])
        return [max(round_) for round_ in ups]

    def steps_of(self, round_: int, rank: int) -> list[int]:
        """The steps a rank showed in one round (by their heartbeats' times), in order."""
        ups = [*self.rounds(), float("inf")]
        return [step for t, k, step in sorted(self.steps) if k == rank and ups[round_] <= t < ups[round_ + 1]]

    def assert_running_in_time(self, rounds: int) -> None:
        """Each round: the agent's `running` (its time: when it saw the round's ranks up) no later than
        RUNNING_BOUND_S after they were all up, and the status RUNNING (for a round after the first, the first
        RUNNING read with the round's in-job restart counted: the RECOVERING between may be too short to be read, as
        when the restart and the new round's `running` arrive in one report) within DELIVERED_BOUND_S of it."""
        ups = self.rounds()
        assert len(ups) == rounds, f"rank rounds seen {ups}"
        said = {
            e["details"]["restart_count"]: datetime.fromisoformat(e["ts"]).timestamp()
            for e in events(self.api, self.job_id, "running")
            if e["details"].get("source") == "agent" and e["details"].get("basis") == "processes"
        }
        for i, up in enumerate(ups):
            shown = next(t for t, status, restarts in self.statuses if restarts >= i and status == "RUNNING")
            assert said[i] - up <= RUNNING_BOUND_S, f"round {i}: running said {said[i] - up:.2f} s after the ranks"
            assert shown - said[i] <= DELIVERED_BOUND_S, f"round {i}: RUNNING shown {shown - said[i]:.2f} s after"


def watch(api: Client, job: dict[str, Any]) -> Watcher:
    return Watcher(api, job["id"])


def sdk_runs(api: Client, job_id: str) -> dict[int, set[int]]:
    """The start steps the ranks' SDK reported, per launcher round."""
    runs: dict[int, set[int]] = {}
    for e in events(api, job_id, "running"):
        if e["details"].get("source") != "agent":
            runs.setdefault(e["details"]["restart_count"], set()).add(e["details"]["start_step"])
    return runs


def assert_consequence_after_cause(api: Client, job_id: str) -> None:
    """Rank 1 was killed; rank 0's broken collective is its consequence, recorded after it; the restart names rank 1."""
    failed = events(api, job_id, "rank_failed")
    assert failed and failed[0]["rank"] == 1, [(e["rank"], e["details"].get("cause")) for e in failed]
    consequences = [e for e in failed if e["details"].get("consequence")]
    assert all(e["rank"] == 0 for e in consequences)
    (restart,) = events(api, job_id, "injob_restart")
    assert restart["details"]["rank"] == 1 and restart["details"]["cause"].startswith("rank 1 killed by SIGKILL")


def test_a_lightning_job_with_the_callback_resumes_from_the_checkpoint_of_the_fault_step(api: Client) -> None:
    """A crash on rank 1 `at_step: 20` (the spec's fault, fired by the callback after ModelCheckpoint wrote step 20):
    Lightning resumes from last.ckpt, step 20, its global step continues, and nothing is redone."""
    ckpt = api.workdir / "lightning-ckpt"  # type: ignore[attr-defined]
    args = ["--steps=30", "--step-delay-s=0.15", f"--checkpoint-dir={ckpt}", "--checkpoint-every=10"]
    job = api.submit(
        spec("pl-callback", "lightning/train.py", args, faults=[{"kind": "crash", "rank": 1, "at_step": 20}])
    )
    watcher = watch(api, job)
    done = finished(api, job["id"])
    watcher.stop()
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    watcher.assert_running_in_time(rounds=2)
    assert watcher.eta_seen and done["progress"]["total_steps"] == 30 and done["progress"]["step"] == 30

    assert sdk_runs(api, job["id"]) == {0: {0}, 1: {20}}  # the global step continues from the checkpoint
    (loaded,) = events(api, job["id"], "checkpoint_loaded")
    assert loaded["step"] == 20 and loaded["details"]["path"].endswith("last.ckpt")
    saved = events(api, job["id"], "checkpoint_saved")
    assert sorted({e["step"] for e in saved}) == [10, 20, 30]
    assert all(e["rank"] == 0 and e["details"]["blocking_s"] > 0 and e["details"]["bytes"] > 0 for e in saved)
    (injected,) = events(api, job["id"], "fault_injected")
    assert injected["rank"] == 1 and injected["step"] == 20  # fired once step 20's checkpoint was written
    assert_consequence_after_cause(api, job["id"])

    goodput = api.request("GET", f"/v1/jobs/{job['id']}/goodput")
    assert goodput["recomputed_steps"] == 0 and goodput["failures"] == 1  # resumed from the fault's own step
    assert [r["basis"] for r in goodput["runs"]] == ["sdk", "sdk"] and goodput["runs"][1]["start_step"] == 20
    assert goodput["advice"]["checkpoints"] >= 3 and goodput["advice"]["current_from"] == "reported checkpoints"
    logs = list((api.workdir / ".ftplane" / "runs" / job["id"] / "work").glob("lightning_logs/version_*"))  # type: ignore[attr-defined]
    assert logs  # Lightning's own output lands with the job, not where the server runs


def test_a_transformers_job_with_the_callback_resumes_from_the_checkpoint_of_the_fault_step(api: Client) -> None:
    """A crash on rank 1 `at_step: 20`, fired after the Trainer wrote checkpoint-20: it resumes from step 20 and
    redoes nothing. An evaluation every 10 steps runs as a phase, not a hang."""
    out = api.workdir / "hf-out"  # type: ignore[attr-defined]
    args = ["--steps=30", "--step-delay-s=0.2", f"--output-dir={out}", "--checkpoint-every=10", "--eval-every=10"]
    job = api.submit(
        spec("hf-callback", "transformers/train.py", args, faults=[{"kind": "crash", "rank": 1, "at_step": 20}])
    )
    watcher = watch(api, job)
    done = finished(api, job["id"])
    watcher.stop()
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    watcher.assert_running_in_time(rounds=2)
    assert watcher.eta_seen and done["progress"]["total_steps"] == 30 and done["progress"]["step"] == 30

    assert sdk_runs(api, job["id"]) == {0: {0}, 1: {20}}
    (loaded,) = events(api, job["id"], "checkpoint_loaded")
    assert loaded["step"] == 20 and loaded["details"]["path"].endswith("checkpoint-20")
    saved = events(api, job["id"], "checkpoint_saved")
    assert sorted({e["step"] for e in saved}) == [10, 20, 30]
    assert all(e["details"]["blocking_s"] > 0 and e["details"]["bytes"] > 0 for e in saved)
    (injected,) = events(api, job["id"], "fault_injected")
    assert injected["rank"] == 1 and injected["step"] == 20
    assert_consequence_after_cause(api, job["id"])
    assert events(api, job["id"], "hang_detected") == []

    goodput = api.request("GET", f"/v1/jobs/{job['id']}/goodput")
    assert goodput["recomputed_steps"] == 0 and goodput["failures"] == 1
    assert [(r["basis"], r["start_step"]) for r in goodput["runs"]] == [("sdk", 0), ("sdk", 20)]


def test_a_zero_code_lightning_job_with_the_preset_reads_the_global_step(api: Client) -> None:
    """No ftplane code, `progress: {preset: lightning}`: every rank's global step, never backwards within a run,
    the total and ETA, where each run resumed from (Lightning's last.ckpt after a crash injected by the agent),
    and goodput's recompute from that."""
    ckpt = api.workdir / "lightning-zero"  # type: ignore[attr-defined]
    args = ["--zero-code", "--steps=40", "--step-delay-s=0.15", f"--checkpoint-dir={ckpt}", "--checkpoint-every=10"]
    job = api.submit(spec("pl-zero-code", "lightning/train.py", args, progress={"preset": "lightning"}))
    watcher = watch(api, job)
    wait("step 14", lambda: (api.job(job["id"])["progress"]["step"] or 0) >= 14, job=(api, job["id"]))
    api.inject(job["id"], {"kind": "crash", "rank": 1, "now": True})
    done = finished(api, job["id"])
    watcher.stop()
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    watcher.assert_running_in_time(rounds=2)
    assert watcher.eta_seen and done["progress"]["total_steps"] == 40 and done["progress"]["step"] == 40

    for round_ in (0, 1):
        for rank in (0, 1):
            seen = watcher.steps_of(round_, rank)
            assert seen and all(a <= b for a, b in zip(seen, seen[1:], strict=False)), (round_, rank, seen)
    runs = {
        e["details"]["restart_count"]: e["details"]["start_step"]
        for e in events(api, job["id"], "running")
        if e["details"].get("basis") == "progress"
    }
    assert runs[0] == 0 and runs[1] in (10, 20, 30)  # where Lightning's last.ckpt was when rank 1 died
    (failed,) = [e for e in events(api, job["id"], "rank_failed") if e["rank"] == 1]
    goodput = api.request("GET", f"/v1/jobs/{job['id']}/goodput")
    assert [r["basis"] for r in goodput["runs"]] == ["progress", "progress"]
    assert goodput["recomputed_steps"] is not None and goodput["recomputed_steps"] >= failed["step"] - runs[1] - 1
