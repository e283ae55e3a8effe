"""`ftplane goodput` and `ftplane get objectives`: the fleet's goodput and its ETTR objectives, over HTTP."""

from __future__ import annotations

import re
from typing import Annotated, Any

import typer
from rich.table import Table

from ftplane.client import Client
from ftplane.terminal import Output, OutputOpt, call, console, print_json

DURATION = re.compile(r"^[1-9][0-9]{0,3}[mhdw]$")
TOP_CAUSES = 3


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ettr(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _lost(figures: dict[str, Any]) -> str:
    """The causes that lost the most GPU-hours: `restart 12.0, recompute 3.1`."""
    lost = sorted(((c, h) for c, h in figures["lost_gpu_hours"].items() if h > 0), key=lambda kv: -kv[1])
    return ", ".join(f"{cause} {hours:,.1f}" for cause, hours in lost[:TOP_CAUSES]) or "-"


def goodput(
    since: Annotated[
        str, typer.Option(help="How far back (30m, 12h, 7d, 2w), or an ISO 8601 time with a time zone.")
    ] = "7d",
    until: Annotated[str | None, typer.Option(help="ISO 8601 time with a time zone (default: now).")] = None,
    by: Annotated[str | None, typer.Option("--by", help="label:<key>, backend, status or project.")] = None,
    bucket: Annotated[str | None, typer.Option(help="Also per bucket this long (1h, 1d).")] = None,
    label: Annotated[list[str] | None, typer.Option(help="Only jobs with key=value (repeatable).")] = None,
    project: Annotated[str | None, typer.Option(help="Only this project's jobs.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Where the fleet's GPU-hours went: productive and lost by cause, ETTR, faults, per group (admins)."""
    params: dict[str, Any] = {"top": 5}
    params.update({"window": since} if DURATION.match(since) else {"since": since})
    for key, value in (("until", until), ("group_by", by), ("bucket", bucket), ("project", project)):
        if value is not None:
            params[key] = value
    if label:
        params["label"] = label
    body = call(Client().request, "GET", "/v1/goodput", params=params)
    if output == Output.json:
        print_json(body)
        return
    priced = body["total"]["cost"] is not None
    table = Table(by or "FLEET", "JOBS", "GPU-H", "PRODUCTIVE", "ETTR", "LOST GPU-H (TOP CAUSES)", "FAULTS", "MTBF H")
    if priced:
        table.add_column("COST")
    rows = [(g["key"] if g["key"] is not None else "(none)", g) for g in body["groups"]] or [("all", body["total"])]
    if body["groups"]:
        rows.append(("all", body["total"]))
    for name, g in rows:
        cells = [
            str(name),
            str(g["jobs"]),
            _num(g["wall_gpu_hours"]),
            _num(g["productive_gpu_hours"]),
            _ettr(g["ettr"]),
            _lost(g),
            str(g["faults_total"]),
            _num(g["mtbf_hours"]),
        ]
        if priced:
            cells.append(_num(g["cost"]["wall"], 2))
        table.add_row(*cells)
    console.print(f"{body['since'][:19]} → {body['until'][:19]} UTC")
    console.print(table)
    if body["top_jobs"]:
        top = Table("JOB", "NAME", "GPUS", "LOST GPU-H", "ETTR", "BY CAUSE", title="Jobs that lost the most")
        for j in body["top_jobs"]:
            causes = ", ".join(f"{c} {h:,.1f}" for c, h in list(j["lost_by_cause"].items())[:TOP_CAUSES])
            top.add_row(j["job_id"], j["name"], str(j["gpus"]), _num(j["lost_gpu_hours"]), _ettr(j["ettr"]), causes)
        console.print(top)


def get_objectives(output: OutputOpt = Output.table) -> None:
    """ETTR objectives of your projects: their ETTR now, budget left, burn rate, breaches."""
    found = call(Client().request, "GET", "/v1/objectives")
    if output == Output.json:
        print_json(found)
        return
    table = Table("ID", "PROJECT", "NAME", "SELECTOR", "TARGET", "WINDOW", "ETTR", "BUDGET LEFT", "BURN", "STATE")
    for o in found:
        status = o.get("status") or {}
        left = status.get("budget_left")
        state = f"[bold red]breached since {o['breached_since'][:19]}[/]" if o["breached_since"] else "[green]ok[/]"
        table.add_row(
            o["id"],
            o["project"],
            o["name"],
            ",".join(f"{k}={v}" for k, v in o["selector"].items()) or "(all)",
            f"{o['target']:g}",
            o["window"],
            _ettr(status.get("ettr")),
            "-" if left is None else f"{left * 100:.0f} %",
            _num(status.get("burn_rate"), 2),
            state,
        )
    console.print(table)
