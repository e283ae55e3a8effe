"""The `ftplane project ...` and `ftplane audit` commands: projects, role bindings and the audit log, over HTTP."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from ftplane.client import Client
from ftplane.terminal import call, console, print_json

project_app = typer.Typer(help="Projects and their role bindings.", no_args_is_help=True)


JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@project_app.command("create")
def project_create(
    name: str,
    gpu_limit: Annotated[int | None, typer.Option(help="GPUs its jobs may hold at once (default: no limit).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Make a project (cluster admins)."""
    body: dict[str, Any] = {"name": name}
    if gpu_limit is not None:
        body["gpu_limit"] = gpu_limit
    made = call(Client().request, "POST", "/v1/projects", json=body)
    print_json(made) if as_json else console.print(f"project {made['name']} created")


@project_app.command("list")
def project_list(as_json: JsonOpt = False) -> None:
    """The projects you hold a role in (every project, for a cluster admin)."""
    projects = call(Client().request, "GET", "/v1/projects")
    if as_json:
        print_json(projects)
        return
    table = Table("NAME", "GPU LIMIT", "CREATED")
    for p in projects:
        table.add_row(p["name"], "-" if p["gpu_limit"] is None else str(p["gpu_limit"]), p["created_at"][:19])
    console.print(table)


@project_app.command("bind")
def project_bind(
    project: str,
    role: Annotated[str, typer.Option(help="viewer | operator | admin")],
    group: Annotated[str | None, typer.Option(help="A value of the JWT's groups claim.")] = None,
    subject: Annotated[str | None, typer.Option(help="A JWT subject (sub).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Give a role in a project to a group or subject of the identity provider (the project's admins)."""
    body = {k: v for k, v in {"group": group, "subject": subject, "role": role}.items() if v is not None}
    made = call(Client().request, "POST", f"/v1/projects/{project}/bindings", json=body)
    print_json(made) if as_json else console.print(f"binding {made['id']}: {made['kind']} {made['value']} → {role}")


def audit(
    since: Annotated[str | None, typer.Option(help="ISO 8601 time: entries at or after it.")] = None,
    actor: Annotated[str | None, typer.Option(help="A token's id or name, or a JWT's subject.")] = None,
    project: Annotated[str | None, typer.Option(help="Entries of this project.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many entries (oldest first).")] = 1000,
    as_json: JsonOpt = False,
) -> None:
    """Who changed what, when, from where, and how it ended."""
    api = Client()
    params = {k: v for k, v in {"since": since, "actor": actor, "project": project}.items() if v is not None}
    entries: list[dict[str, Any]] = []
    cursor = 0
    while len(entries) < limit:
        page = call(api.request, "GET", "/v1/audit", params={**params, "cursor": cursor, "limit": 1000})
        entries.extend(page["items"])
        if not page["next_cursor"]:
            break
        cursor = int(page["next_cursor"])
    entries = entries[:limit]
    if as_json:
        print_json(entries)
        return
    table = Table("TIME", "ACTOR", "ACTION", "OBJECT", "PROJECT", "FROM", "OUTCOME")
    for e in entries:
        obj = f"{e['object_type']} {e['object_id'] or ''}".rstrip()
        table.add_row(
            e["ts"][:19], e["actor_name"], e["action"], obj, e["project"] or "-", e["address"] or "-", str(e["outcome"])
        )
    console.print(table)
