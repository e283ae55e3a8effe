"""`make demo`: ftplane on embedded defaults runs the tiny job through every rung of the ladder.

Starts `ftplane serve`, submits examples/tiny-local.yaml (2 CPU ranks under
ft_launcher, async checkpoints), injects an exception (in-process restart), a
crash (in-job restart) and a hang (detected, restarted), shows progress, waits
for SUCCEEDED, then prints the fault history and each fault's recovery time.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from api.core.config import get_settings
from ftplane.client import ApiFailure, Client
from ftplane.devserver import ftplane_server

console = Console(width=None if sys.stdout.isatty() else 150)
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-local.yaml"
RESTARTS = ("inprocess_restart", "injob_restart", "job_restart")


class Demo:
    def __init__(self, client: Client, job_id: str):
        self.client = client
        self.job_id = job_id
        self.last_line = ""

    def events(self) -> list[dict[str, Any]]:
        return self.client.all_events(self.job_id)

    def step(self) -> int:
        return max((r["step"] for r in self.client.ranks(self.job_id)), default=0)

    def show(self) -> dict[str, Any]:
        job = self.client.job(self.job_id)
        types = [e["type"] for e in self.events()]
        counts = "  ".join(f"{t.split('_')[0]}={types.count(t)}" for t in RESTARTS)
        line = f"{job['status']:<10} attempt {job['attempt']}  step {self.step():>3}  restarts: {counts}"
        if line != self.last_line:
            console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim]  {line}", highlight=False)
            self.last_line = line
        return job

    def wait(self, what: str, done: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            job = self.show()
            if job["status"] in ("FAILED", "CANCELLED"):
                raise SystemExit(f"job ended {job['status']}: {job.get('status_reason')}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}")
            time.sleep(0.5)

    def count(self, type_: str) -> int:
        return sum(1 for e in self.events() if e["type"] == type_)

    def inject(self, kind: str, rank: int, **when: Any) -> None:
        body = {"kind": kind, "rank": rank, **(when or {"now": True})}
        fault = self.client.inject(self.job_id, body)
        console.print(f"[bold yellow]→ injecting {kind} on rank {rank}[/bold yellow] ({fault['delivery']})")


def recovery_table(events: list[dict[str, Any]]) -> Table:
    """Each fault: which rung recovered it and how long until training ran again."""
    table = Table("fault", "rank", "injected at step", "recovered by", "resumed from step", "recovery (s)")
    ts = {id(e): datetime.fromisoformat(e["ts"]) for e in events}
    for i, fault in enumerate(events):
        if fault["type"] != "fault_injected":
            continue
        later = events[i + 1 :]
        rung = next((e for e in later if e["type"] in RESTARTS), None)
        resumed = next((e for e in later if e["type"] == "running"), None)
        seconds = (ts[id(resumed)] - ts[id(fault)]).total_seconds() if resumed else None
        table.add_row(
            str(fault["details"].get("kind", "?")),
            str(fault.get("rank")),
            str(fault.get("step") if fault.get("step") is not None else "-"),
            rung["type"] if rung else "-",
            str(resumed["details"].get("start_step", "-")) if resumed else "-",
            f"{seconds:.1f}" if seconds is not None else "-",
        )
    return table


def main() -> None:
    data_dir = Path(get_settings().data_dir).resolve()
    with ftplane_server(
        Path.cwd(), port=8000, FTPLANE_DATA_DIR=str(data_dir), FTPLANE_SUPERVISE_INTERVAL_S="1"
    ) as server:
        run(Client(url=server.url, token=server.token), server.url, data_dir, server.log)


def run(client: Client, url: str, data_dir: Path, log: Path) -> None:
    try:
        spec = yaml.safe_load(EXAMPLE.read_text())
        spec["checkpoint"]["dir"] = str(data_dir / "checkpoints" / f"demo-{int(time.time())}")
        job = client.submit(spec)
        console.print(f"submitted [bold]{job['name']}[/bold] as job {job['id']} — API and docs at {url}/docs")
        demo = Demo(client, job["id"])

        demo.wait("training to start", lambda: demo.step() >= 8)
        demo.inject("exception", 1, at_step=demo.step() + 3)
        demo.wait("the in-process restart", lambda: demo.count("inprocess_restart") >= 1)

        base = demo.step()
        demo.wait("training to resume", lambda: demo.step() >= max(base, 20) + 5)
        demo.inject("crash", 1)
        demo.wait("the in-job restart", lambda: demo.count("injob_restart") >= 1)

        base = demo.step()
        demo.wait("training to resume", lambda: demo.step() >= base + 8)
        demo.inject("hang", 0)
        demo.wait("the hang to be detected", lambda: demo.count("hang_detected") >= 1)
        demo.wait("the restart after the hang", lambda: demo.count("injob_restart") >= 2)

        demo.wait("SUCCEEDED", lambda: demo.show()["status"] == "SUCCEEDED", timeout=240)
        events = demo.events()
        history = Table("time", "attempt", "event", "rank", "step", "cause / details")
        for e in events:
            detail = e["details"].get("cause") or ", ".join(f"{k}={v}" for k, v in list(e["details"].items())[:3])
            history.add_row(
                e["ts"][11:23],
                str(e["attempt"]),
                e["type"],
                "" if e["rank"] is None else str(e["rank"]),
                "" if e["step"] is None else str(e["step"]),
                str(detail)[:70],
            )
        console.rule("fault history")
        console.print(history)
        console.rule("recovery per fault (fault injected → training running again)")
        console.print(recovery_table(events))
        console.print(f"[green]job {job['id']} SUCCEEDED[/green]. The server log is {log}.")
    except ApiFailure as exc:
        raise SystemExit(f"API error: {exc}") from exc


if __name__ == "__main__":
    main()
