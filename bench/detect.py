"""Detection benchmark: a rank goes silent -> hang_detected -> the webhook arrives.

A real `ftplane serve` (API + Celery worker + beat) on a fresh PostgreSQL database with Redis as the
broker (its own queue name), supervising at the product's default period (FTPLANE_SUPERVISE_INTERVAL_S
= 2 s unless --supervise-interval says otherwise). A webhook subscription for hang_detected points
at a receiver in this process (loopback; FTPLANE_WEBHOOK_ALLOW_PRIVATE=true).

The job is real as far as the control plane can tell: the local backend launches it under real
ft_launcher, but its ranks only sleep. The ranks the control plane hears from are simulated here:
one node of 8 ranks posting heartbeats every --beat-interval seconds with the job's trainer token.
In each trial one rank stops beating (at a random phase of the supervision period); its silence
starts at the `ts` of its last heartbeat, S. The benchmark measures

    detect   S -> the hang_detected event's ts (the supervisor noticed)
    webhook  S -> the signed webhook received by the local receiver

then the rank resumes (before the silence lasts twice the timeout, which would escalate to a job
restart); a webhook not yet received by then is still waited for, up to --wait seconds from S, and
measured as late rather than dropped. Target: webhook <= heartbeat timeout + 2 s. Figures: median /
p95 / max over the trials, and the margin over the timeout itself (the part the control plane adds).

Usage: python -m bench.detect [--trials 12] [--timeout 5] [--supervise-interval 2] [--wait 60] [--embedded]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.common import create_admin_token, fresh_database, machine, percentile, table
from ftplane.devserver import ftplane_server
from tests.support.receivers import Received, Receiver
from tests.support.waiting import wait_for

RANKS = 8
MARGIN_TARGET_S = 2.0


# ---- the simulated ranks -------------------------------------------------------------------------


class Ranks:
    """One node's ranks posting heartbeats in one batch per interval; any rank can be silenced."""

    def __init__(self, url: str, job_id: str, token: str, interval: float):
        self.http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.path = f"/v1/jobs/{job_id}/heartbeats"
        self.interval = interval
        self.silent: set[int] = set()
        self.last_ts: dict[int, datetime] = {}
        self.step = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.beat()
            self.stop.wait(self.interval)

    def beat(self) -> None:
        with self.lock:
            now = datetime.now(UTC)
            self.step += 1
            alive = [r for r in range(RANKS) if r not in self.silent]
            beats = [{"rank": r, "step": self.step, "ts": now.isoformat(), "node": "sim-node-0"} for r in alive]
            for r in alive:
                self.last_ts[r] = now
        if beats:
            self.http.post(self.path, json={"heartbeats": beats}).raise_for_status()

    def silence(self, rank: int) -> datetime:
        """Stop `rank`; returns the ts of its last heartbeat (where its silence starts)."""
        with self.lock:
            self.silent.add(rank)
            return self.last_ts[rank]

    def resume(self, rank: int) -> None:
        with self.lock:
            self.silent.discard(rank)
        self.beat()

    def __enter__(self) -> Ranks:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.http.close()


# ---- the benchmark -------------------------------------------------------------------------------


@dataclass
class Trial:
    rank: int
    detect_s: float
    webhook_s: float


@contextlib.contextmanager
def control_plane(args: argparse.Namespace, workdir: Path) -> Iterator[tuple[str, str]]:
    """(url, admin token) of a running `ftplane serve`."""
    env: dict[str, Any] = {
        "FTPLANE_WEBHOOK_ALLOW_PRIVATE": "true",
        "FTPLANE_SUPERVISE_INTERVAL_S": str(args.supervise_interval),
    }
    if args.embedded:
        with ftplane_server(workdir, **env) as server:
            yield server.url, server.token
        return
    with fresh_database(args.database_url, prefix="ftplane_detect") as db:
        token = create_admin_token(db)
        data_dir = workdir / ".ftplane"
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / "admin-token").write_text(token + "\n")  # where the dev server looks for it
        env.update(
            FTPLANE_DATABASE_URL=db,
            FTPLANE_REDIS_URL=args.redis_url,
            FTPLANE_QUEUE=f"ftplane-bench-{uuid.uuid4().hex[:8]}",  # the Redis may be shared
        )
        with ftplane_server(workdir, **env) as server:
            yield server.url, server.token


def run(args: argparse.Namespace) -> list[Trial]:
    trials: list[Trial] = []
    with tempfile.TemporaryDirectory(prefix="ftplane-detect-") as tmp, Receiver() as receiver:
        workdir = Path(tmp)
        with control_plane(args, workdir) as (url, admin):
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
            hook = api.post("/v1/webhooks", json={"url": receiver.url + "/hooks", "event_types": ["hang_detected"]})
            hook.raise_for_status()
            spec = {
                "name": "detect-bench",
                "command": ["python", "-c", "import time; time.sleep(86400)"],
                "procs_per_node": 1,
                "checkpoint": {"engine": "none"},
                # The job's node agent must report at least 3 times per heartbeat timeout (a spec rule).
                "progress": {"report_interval_s": min(1.0, args.timeout / 3)},
                "resiliency": {
                    "heartbeat_timeout_s": args.timeout,
                    "initial_heartbeat_timeout_s": 3600,
                    "max_in_job_restarts": 0,
                    "max_job_restarts": 0,
                },
            }
            created = api.post("/v1/jobs", json=spec)
            created.raise_for_status()
            job_id, token = created.json()["id"], created.json()["token"]
            wait_for("the job to be launched", lambda: api.get(f"/v1/jobs/{job_id}").json()["status"] != "PENDING", 120)
            try:
                rng = random.Random(args.seed)
                with Ranks(url, job_id, token, args.beat_interval) as ranks:
                    time.sleep(2 * args.beat_interval)
                    for i in range(args.trials):
                        rank = i % RANKS
                        # Silence is judged in a running attempt only: on a busy machine its launch can take
                        # longer than the pause above.
                        wait_for("the attempt to run", functools.partial(attempt_running, api, job_id), 120)
                        time.sleep(rng.uniform(0, args.supervise_interval))  # a random phase of the supervision period
                        silent_from = ranks.silence(rank).timestamp()
                        announced = functools.partial(hang_of, rank=rank, after=silent_from)
                        # Resume before the silence lasts two timeouts (that would escalate to a job
                        # restart); a webhook still on its way is then waited for and measured late.
                        got = receiver.first(announced, timeout=2 * args.timeout - 0.5)
                        ranks.resume(rank)
                        if got is None:
                            got = receiver.first(announced, timeout=args.wait - (2 * args.timeout - 0.5))
                        if got is None:
                            print(f"  trial {i + 1}: rank {rank}: no webhook within {args.wait:g} s")
                            continue
                        detected = _ts(got.json()["data"]["event"]["ts"])
                        trial = Trial(rank, detected - silent_from, got.wall - silent_from)
                        trials.append(trial)
                        print(
                            f"  trial {i + 1}/{args.trials}: rank {rank} silent -> "
                            f"hang_detected {trial.detect_s:.2f} s, webhook {trial.webhook_s:.2f} s",
                            flush=True,
                        )
                        time.sleep(args.beat_interval + 0.5)
            finally:
                cancel(api, job_id)  # the local backend's launcher outlives the server by design
            api.close()
    return trials


def cancel(api: httpx.Client, job_id: str, timeout: float = 60) -> None:
    """Cancel the job and wait until its processes are torn down."""
    api.post(f"/v1/jobs/{job_id}/cancel")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and api.get(f"/v1/jobs/{job_id}").json()["status"] != "CANCELLED":
        time.sleep(0.3)


def attempt_running(api: httpx.Client, job_id: str) -> bool:
    attempts = api.get(f"/v1/jobs/{job_id}").json()["attempts"]
    return bool(attempts) and attempts[-1]["status"] == "RUNNING"


def hang_of(received: Received, *, rank: int, after: float) -> bool:
    """The webhook announces `rank`'s hang_detected stored after `after` (Unix time)."""
    message = received.json()
    event = message.get("data", {}).get("event", {})
    return message.get("type") == "hang_detected" and event.get("rank") == rank and _ts(event["ts"]) > after


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def report(trials: list[Trial], args: argparse.Namespace) -> str:
    target = args.timeout + MARGIN_TARGET_S
    rows = []
    for name, values in (
        ("silence -> hang_detected", [t.detect_s for t in trials]),
        ("silence -> webhook received", [t.webhook_s for t in trials]),
        ("webhook delivery (hang_detected -> received)", [t.webhook_s - t.detect_s for t in trials]),
    ):
        rows.append(
            [
                name,
                len(values),
                statistics.median(values),
                percentile(values, 95),
                max(values),
                statistics.median(values) - (args.timeout if "silence" in name else 0),
            ]
        )
    out = table(["leg", "trials", "median s", "p95 s", "max s", "median over the timeout s"], rows)
    webhook = [t.webhook_s for t in trials]
    verdict = "met" if webhook and max(webhook) <= target else "missed"
    return (
        out + f"\n\ntarget: webhook <= heartbeat timeout + {MARGIN_TARGET_S:g} s = {target:g} s: {verdict} "
        f"(max {max(webhook):.2f} s, p95 {percentile(webhook, 95):.2f} s)"
        if webhook
        else out
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--timeout", type=float, default=5.0, help="the job's heartbeat_timeout_s")
    parser.add_argument("--beat-interval", type=float, default=1.0, help="seconds between a rank's heartbeats")
    parser.add_argument(
        "--wait", type=float, default=60.0, help="seconds a trial waits for its webhook before it counts as missed"
    )
    parser.add_argument("--supervise-interval", type=float, default=2.0, help="FTPLANE_SUPERVISE_INTERVAL_S")
    parser.add_argument("--embedded", action="store_true", help="SQLite + embedded broker instead of PG + Redis")
    parser.add_argument("--database-url", help="PostgreSQL server to create the fresh database on")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    store = "SQLite + embedded broker" if args.embedded else "PostgreSQL + Redis"
    print(
        f"ftplane serve ({store}), supervision every {args.supervise_interval:g} s; heartbeat timeout "
        f"{args.timeout:g} s; {RANKS} simulated ranks beating every {args.beat_interval:g} s",
        flush=True,
    )
    trials = run(args)
    print()
    print(report(trials, args))
    if args.json:
        args.json.write_text(json.dumps([vars(t) for t in trials], indent=2))
    return 0 if len(trials) == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
