"""`ftplane get nodes`, `ftplane describe node NAME` and `ftplane release node NAME --reason ...`: the fleet's
nodes, over HTTP (cluster admins)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from ftplane.client import Client
from ftplane.terminal import Output, OutputOpt, call, console, print_json

release_app = typer.Typer(help="Put something back into use.", no_args_is_help=True)


class State(StrEnum):
    healthy = "healthy"
    suspect = "suspect"
    quarantined = "quarantined"


STATE_STYLE = {"healthy": "green", "suspect": "yellow", "quarantined": "bold red"}
LISTED = 20  # faults, runs and history entries `describe node` prints of each


def _faults(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "-"


def _state(node: dict[str, Any]) -> str:
    state = str(node["state"])
    until = f" until {node['quarantined_until'][:19]}" if node.get("quarantined_until") else ""
    return f"[{STATE_STYLE.get(state, '')}]{state}[/]{until}"


def get_nodes(
    state: Annotated[State | None, typer.Option(help="Only the nodes in this state.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Every node ftplane has run on, with its state and the faults blamed on it (cluster admins)."""
    api = Client()
    nodes: list[dict[str, Any]] = []
    params: dict[str, Any] = {"limit": 1000, **({"state": state.value} if state else {})}
    while True:
        page = call(api.request, "GET", "/v1/nodes", params=params)
        nodes.extend(page["nodes"])
        if not page["next_cursor"]:
            break
        params["cursor"] = page["next_cursor"]
    if output == Output.json:
        print_json(nodes)
        return
    table = Table("NAME", "STATE", "FAULTS", "LAST FAULT", "JOBS")
    for node in nodes:
        last = node.get("last_fault")
        when = f"{last['ts'][:19]} {last['kind']} (job {last['job_id']})" if last else "-"
        table.add_row(node["name"], _state(node), _faults(node["faults"]), when, str(node["jobs"]))
    console.print(table)


def describe_node(name: str, output: OutputOpt = Output.table) -> None:
    """One node: its state and why, its faults, the jobs that ran on it, its history (cluster admins)."""
    node = call(Client().request, "GET", f"/v1/nodes/{name}")
    if output == Output.json:
        print_json(node)
        return
    console.print(f"[bold]{node['name']}[/bold]  {_state(node)}  since {node['state_since'][:19]}")
    if node.get("reason"):
        console.print(f"why: {node['reason']}", highlight=False)
    console.print(f"faults: {_faults(node['faults'])}   jobs: {node['jobs']}")
    console.print("recent faults:")
    for fault in node["recent_faults"][:LISTED]:
        counted = "" if fault["counted"] else "  (not counted)"
        line = f"  {fault['ts'][:19]}  {fault['kind']:<10} job {fault['job_id']} a{fault['attempt']}{counted}"
        console.print(f"{line}  {fault.get('reason') or ''}".rstrip(), highlight=False, markup=False)
    console.print("ran:")
    for run in node["runs"][:LISTED]:
        job = f"{run['job_name']} ({run['job_id']}, {run['project']})"
        console.print(f"  {run['last_seen'][:19]}  {job} attempt {run['attempt']}", highlight=False, markup=False)
    console.print("history:")
    for entry in node["history"][:LISTED]:
        line = f"  {entry['ts'][:19]}  {entry['action']:<11} by {entry['actor']}: {entry.get('reason') or ''}"
        console.print(line.rstrip(": "), highlight=False, markup=False)


@release_app.command("node")
def release_node(
    name: str,
    reason: Annotated[str, typer.Option(help="Why it may be used again (kept in its history), e.g. 'GPU replaced'.")],
    output: OutputOpt = Output.table,
) -> None:
    """Put a node back into placement: its faults so far are forgiven (cluster admins)."""
    node = call(Client().request, "POST", f"/v1/nodes/{name}/release", json={"reason": reason})
    if output == Output.json:
        print_json(node)
        return
    console.print(f"node {node['name']} released: {_state(node)}")


def register(app: typer.Typer, get_app: typer.Typer, describe_app: typer.Typer) -> None:
    """Add the node commands to the `ftplane` command line."""
    get_app.command("nodes")(get_nodes)
    describe_app.command("node")(describe_node)
    app.add_typer(release_app, name="release")
