"""The `ftplane` command line: its commands on jobs and tokens, over HTTP; `serve` is in ftplane/serve.py."""

from __future__ import annotations

import json
import signal
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

try:
    import typer
    import yaml
    from pydantic import ValidationError
    from rich.table import Table
except ImportError as missing:  # a training image's base install has the node side only
    raise SystemExit(
        f"the ftplane command needs the control plane's packages ({missing.name} is missing): "
        "pip install 'ftplane[server]'"
    ) from None

from ftplane.access import audit, project_app
from ftplane.client import ApiFailure, Client
from ftplane.fleet_commands import get_objectives, goodput
from ftplane.node_commands import register as register_node_commands
from ftplane.serve import serve
from ftplane.terminal import Output, OutputOpt, call, console, err, fail, print_json

app = typer.Typer(
    help="ftplane: a control plane for fault-tolerant distributed PyTorch training.", no_args_is_help=True
)
get_app = typer.Typer(help="List resources.", no_args_is_help=True)
describe_app = typer.Typer(help="Show one resource in detail.", no_args_is_help=True)
token_app = typer.Typer(help="Manage API tokens (run where the database is reachable).", no_args_is_help=True)
app.add_typer(get_app, name="get")
app.add_typer(describe_app, name="describe")
app.add_typer(token_app, name="token")
app.add_typer(project_app, name="project")
app.command()(serve)
app.command()(audit)
register_node_commands(app, get_app, describe_app)
app.command()(goodput)
get_app.command("objectives")(get_objectives)

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


SpecOpt = Annotated[Path, typer.Option("--file", "-f", help="Job spec (YAML or JSON).", exists=True, dir_okay=False)]


def client() -> Client:
    return Client()


def load_spec(path: Path) -> dict[str, Any]:
    """The spec in `path`; for the local backend (which runs jobs on this host), a relative `working_dir` made
    absolute against the directory this command runs in."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        fail(f"{path} is not valid YAML or JSON: {exc}")
    if not isinstance(data, dict):
        fail(f"{path} must hold a mapping (the job spec)")
    spec = dict(data)
    workdir = spec.get("working_dir")
    if spec.get("backend", "local") == "local" and isinstance(workdir, str) and not workdir.startswith("/"):
        spec["working_dir"] = str((Path.cwd() / workdir).resolve())
    return spec


def fmt_event(e: dict[str, Any]) -> str:
    where = " ".join(
        part
        for part in (
            f"rank={e['rank']}" if e.get("rank") is not None else "",
            f"node={e['node']}" if e.get("node") else "",
            f"step={e['step']}" if e.get("step") is not None else "",
        )
        if part
    )
    cause = e.get("details", {}).get("cause", "")
    return f"{e['ts'][:23]}  a{e['attempt']}  {e['type']:<18} {where} {cause}".rstrip()


def fmt_log_line(text: str, *, whose: bool, output: Output) -> str:
    """One NDJSON line of the logs route as the command prints it: as it came (json), or the rank's line, with
    its rank in front when several ranks are shown."""
    if output == Output.json:
        return text
    line = json.loads(text)
    return f"[rank{line['rank']}] {line['line']}" if whose else str(line["line"])


# ---- jobs ----------------------------------------------------------------------------------


@app.command()
def submit(file: SpecOpt, output: OutputOpt = Output.table) -> None:
    """Submit a job spec."""
    job = call(client().submit, load_spec(file))
    if output == Output.json:
        print_json(job)
        return
    console.print(f"job [bold]{job['id']}[/bold] ({job['name']}) accepted: {job['status']}")
    console.print(f"trainer token (shown once): {job['token']}")


@get_app.command("jobs")
def get_jobs(
    output: OutputOpt = Output.table,
    status: Annotated[list[str] | None, typer.Option(help="Filter by status (repeatable).")] = None,
    label: Annotated[list[str] | None, typer.Option(help="Filter by key=value (repeatable).")] = None,
    limit: int = 50,
) -> None:
    """List jobs, newest first."""
    page = call(client().jobs, status=status or [], label=label or [], limit=limit)
    if output == Output.json:
        print_json(page)
        return
    table = Table("ID", "NAME", "PROJECT", "STATUS", "BACKEND", "ATTEMPT", "CREATED", "REASON")
    for job in page["items"]:
        table.add_row(
            job["id"],
            job["name"],
            job["project"],
            job["status"],
            job["backend"],
            str(job["attempt"]),
            job["created_at"][:19],
            (job.get("status_reason") or "")[:60],
        )
    console.print(table)


@describe_app.command("job")
def describe_job(job_id: str, output: OutputOpt = Output.table) -> None:
    """A job's spec, status, attempts and recent events."""
    job = call(client().job, job_id)
    if output == Output.json:
        print_json(job)
        return
    console.print(f"[bold]{job['name']}[/bold]  {job['id']}  project: {job['project']}")
    console.print(f"status: {job['status']}  {job.get('status_reason') or ''}", markup=False)  # causes quote [...]
    console.print(f"attempt: {job['attempt']}  job restarts: {job['job_restarts']}  backend: {job['backend']}")
    if job["excluded_nodes"]:
        console.print(f"excluded nodes: {', '.join(job['excluded_nodes'])}")
    progress = job.get("progress") or {}
    if progress.get("step") is not None:
        line = f"progress: step {progress['step']}"
        if progress.get("total_steps"):
            line += f" of {progress['total_steps']} ({progress['fraction'] * 100:.0f} %)"
        if progress.get("eta_s") is not None:
            line += f", ETA {progress['eta_s']:.0f} s"
        console.print(line)
    if progress.get("hang_detection") == "node":
        console.print("hang detection: node-level only (the ranks report no progress: add the SDK or a log pattern)")
    console.print("spec:")
    console.print(yaml.safe_dump(job["spec"], sort_keys=False).rstrip())
    console.print("recent events:")
    for event in job["recent_events"]:
        console.print("  " + fmt_event(event), highlight=False, markup=False)
    failure = last_failure(job_id)
    if failure is not None:
        cause = failure["details"]["cause"]
        console.print(f"last failure ({failure['type']}, attempt {failure['attempt']}): {cause}", markup=False)
        console.print("  " + failure["details"]["tail"].replace("\n", "\n  "), highlight=False, markup=False)
        console.print(f"  (all of it: ftplane logs {job_id} --attempt {failure['attempt']})", highlight=False)


def last_failure(job_id: str) -> dict[str, Any] | None:
    """The newest restart or end whose cause carries the failed rank's last lines."""
    found = call(client().all_events, job_id, type=["injob_restart", "job_restart", "failed"])
    with_tail = [e for e in found if isinstance(e.get("details", {}).get("tail"), str)]
    return with_tail[-1] if with_tail else None


@app.command()
def events(
    job_id: str,
    output: OutputOpt = Output.table,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new events until the job ends.")
    ] = False,
    type_: Annotated[list[str] | None, typer.Option("--type", help="Filter by event type (repeatable).")] = None,
) -> None:
    """A job's fault history."""
    api = client()
    cursor = 0
    while True:
        page = call(api.events, job_id, cursor=cursor, limit=1000, type=type_ or [])
        for event in page["items"]:
            if output == Output.json:
                sys.stdout.write(json.dumps(event, default=str) + "\n")
            else:
                console.print(fmt_event(event), highlight=False, markup=False)
            cursor = event["id"]
        sys.stdout.flush()
        if page["next_cursor"]:
            continue
        if not follow or call(api.job, job_id)["status"] in TERMINAL and not page["items"]:
            return
        time.sleep(1.0)


@app.command()
def logs(
    job_id: str,
    rank: Annotated[int | None, typer.Option("--rank", help="One rank's lines (default: every rank's).")] = None,
    node: Annotated[str | None, typer.Option("--node", help="One node's ranks.")] = None,
    attempt: Annotated[int | None, typer.Option("--attempt", help="Default: the newest.")] = None,
    tail: Annotated[int | None, typer.Option("--tail", help="The last N lines.")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines while the ranks run.")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """What a job's ranks printed, like `kubectl logs`: each line with its rank, or one rank's lines as printed."""
    params: dict[str, Any] = {"rank": rank, "node": node, "attempt": attempt, "tail": tail}
    params = {k: v for k, v in params.items() if v is not None} | ({"follow": "true"} if follow else {})
    api, cursor, first = client(), None, True
    try:
        while True:
            with api.logs(job_id, **params, **({"cursor": cursor} if cursor else {})) as response:
                for said in (response.headers.get("ftplane-logs-notice"), response.headers.get("link")):
                    if said and first:
                        err.print(said, highlight=False, markup=False)
                for text in response.iter_lines():
                    if text:  # a blank line is a keep-alive
                        sys.stdout.write(fmt_log_line(text, whose=rank is None, output=output) + "\n")
                        sys.stdout.flush()
                cursor, first = response.headers.get("ftplane-next-cursor"), False
            if not cursor:
                return
    except ApiFailure as exc:
        fail(exc.message if exc.status else str(exc))


@app.command()
def cancel(job_id: str, output: OutputOpt = Output.table) -> None:
    """Cancel a job."""
    job = call(client().cancel, job_id)
    if output == Output.json:
        print_json(job)
    else:
        console.print(f"job {job_id}: {job['status']}{' (cancel requested)' if job['cancel_requested'] else ''}")


@app.command()
def inject(
    job_id: str,
    kind: Annotated[str, typer.Option(help="exception | crash | hang | node_loss | slowdown")],
    rank: Annotated[int, typer.Option(help="Global rank to hit.")],
    at_step: Annotated[int | None, typer.Option(help="Inject when this step is reached (default: now).")] = None,
    fraction: Annotated[
        float | None, typer.Option(help="slowdown: extra time per step, as a fraction of the step time (0, 10].")
    ] = None,
    duration_steps: Annotated[int | None, typer.Option(help="slowdown: for how many steps.")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Inject a fault into a running job."""
    body: dict[str, Any] = {"kind": kind, "rank": rank}
    body.update({"at_step": at_step} if at_step is not None else {"now": True})
    if fraction is not None or duration_steps is not None:
        body.update(fraction=fraction, duration_steps=duration_steps)
    fault = call(client().inject, job_id, body)
    if output == Output.json:
        print_json(fault)
    else:
        console.print(f"fault {fault['id']}: {kind} on rank {rank}, delivered by the {fault['delivery']}")


@app.command()
def render(file: SpecOpt) -> None:
    """Print what a backend would launch for attempt 0 of a spec, without launching it."""
    from api.schemas.spec import JobSpec
    from workers.backends import UnknownBackend, get_backend
    from workers.backends.base import LaunchRequest

    try:
        spec = JobSpec.model_validate(load_spec(file))
    except ValidationError as exc:
        fail(f"invalid spec {file}:\n{exc}")
        return
    try:
        backend = get_backend(spec.backend)
    except UnknownBackend as exc:
        fail(str(exc))
        return
    request = LaunchRequest(
        job_id="<job-id>", attempt=0, spec=spec, token="<job token>", control_plane_url="<FTPLANE_URL>"
    )
    sys.stdout.write(backend.render(request))


# ---- tokens ----------------------------------------------------------------------------------


class TokenRole(StrEnum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="What the token is for.")] = "admin",
    project: Annotated[str | None, typer.Option(help="The project it acts in; absent: a cluster admin's.")] = None,
    role: Annotated[TokenRole | None, typer.Option(help="Its role in --project (default viewer).")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create a token with a role in a project, or a cluster admin's (written to the database directly: no token
    needed to make the first one)."""
    from api import models
    from api.core.authz import Role
    from api.core.db import session_scope, upgrade_to_head
    from api.services.audit import host_change

    if role is not None and project is None:
        fail("--role needs --project (a token without a project is a cluster admin's)")
    upgrade_to_head()
    with session_scope() as session:
        if project is not None and models.projects.get(session, project) is None:
            fail(f"unknown project {project!r}: make it first (ftplane project create {project})")
        given = Role((role or TokenRole.viewer).value) if project is not None else None
        row, token = models.tokens.create(session, name, project=project, role=given)
        token_id, token_role = row.id, row.role
        host_change(session, "ftplane token create", "token", token_id, project, name=name, role=token_role)
    if output == Output.json:
        print_json({"id": token_id, "name": name, "project": project, "role": token_role, "token": token})
    else:
        where = f" in project {project}" if project else ""
        console.print(f"{token_role} token {token_id} ({name}){where}, shown once:")
        sys.stdout.write(token + "\n")


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    app()


if __name__ == "__main__":
    main()
