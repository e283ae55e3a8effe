"""The `ftplane` command line: run the control plane, and talk to it over HTTP."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from ftplane.client import ADMIN_TOKEN_FILE, ApiFailure, Client

app = typer.Typer(
    help="ftplane: a control plane for fault-tolerant distributed PyTorch training.", no_args_is_help=True
)
get_app = typer.Typer(help="List resources.", no_args_is_help=True)
describe_app = typer.Typer(help="Show one resource in detail.", no_args_is_help=True)
token_app = typer.Typer(help="Manage API tokens (run where the database is reachable).", no_args_is_help=True)
app.add_typer(get_app, name="get")
app.add_typer(describe_app, name="describe")
app.add_typer(token_app, name="token")

console = Console()
err = Console(stderr=True)

TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
KEEP_ALIVE_S = 75  # longer than a node agent's keep-alive (60 s), so the agent, not the server, closes


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
SpecOpt = Annotated[Path, typer.Option("--file", "-f", help="Job spec (YAML or JSON).", exists=True, dir_okay=False)]


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def client() -> Client:
    return Client()


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiFailure as exc:
        fail(exc.message if exc.status else str(exc))


def load_spec(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        fail(f"{path} is not valid YAML or JSON: {exc}")
    if not isinstance(data, dict):
        fail(f"{path} must hold a mapping (the job spec)")
    return dict(data)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


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


# ---- running the control plane -------------------------------------------------------------


class Part(StrEnum):
    all = "all"
    api = "api"
    worker = "worker"
    beat = "beat"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bootstrap_admin_token() -> None:
    """Embedded set-up only: make a first admin token and keep it where the CLI finds it."""
    from api.core.config import get_settings
    from api.core.db import session_scope
    from api.models import tokens

    settings = get_settings()
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    if settings.database_url or path.exists():
        return
    with session_scope() as session:
        if any(t.role == "admin" and t.revoked_at is None for t in tokens.list_tokens(session)):
            return
        _, token = tokens.create_admin(session, "bootstrap (ftplane serve)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    err.print(f"created an admin token and saved it to {path} (the CLI uses it when FTPLANE_TOKEN is unset)")


def die_with_parent() -> None:
    """In the child: the kernel sends SIGTERM when `ftplane serve` dies, however it dies (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def celery_command(part: Part, loglevel: str = "INFO") -> list[str]:
    """The worker (with embedded beat for `all`) or beat process of `ftplane serve`."""
    base = [sys.executable, "-m", "celery", "-A", "workers.celery_app:celery_app"]
    if part == Part.beat:
        return [*base, "beat", f"--loglevel={loglevel}"]
    command = [*base, "worker", f"--loglevel={loglevel}", "--pool=solo", "--without-gossip", "--without-mingle"]
    if part == Part.all:
        command.append("--beat")
    return command


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Listen address (FTPLANE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (FTPLANE_PORT).")] = None,
    only: Annotated[Part, typer.Option(help="Run one part only: api, worker or beat.")] = Part.all,
    workers: Annotated[int, typer.Option(help="API worker processes.")] = 1,
) -> None:
    """Run the control plane: API, worker and beat in one command on embedded defaults."""
    if host:
        os.environ["FTPLANE_HOST"] = host
    if port:
        os.environ["FTPLANE_PORT"] = str(port)
    from api.core.config import get_settings
    from api.core.db import upgrade_to_head

    get_settings.cache_clear()
    settings = get_settings()
    if not settings.auth_enabled and not is_loopback(settings.host):
        fail(f"FTPLANE_AUTH=disabled is refused on the non-loopback address {settings.host}: enable auth")
    upgrade_to_head(settings)
    if only == Part.all and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # API and worker are separate processes on this host: /metrics sums both (restarts are counted
        # by the worker's supervisor). Stale files of an earlier run would be summed too, so start empty.
        metrics_dir = (Path(settings.data_dir) / "prometheus").resolve()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    if only in (Part.all, Part.api):
        bootstrap_admin_token()
    children: list[subprocess.Popen[bytes]] = []
    if only in (Part.worker, Part.beat):
        os.execv(sys.executable, celery_command(only))
    if only == Part.all:
        children.append(subprocess.Popen(celery_command(Part.all), preexec_fn=die_with_parent))

    def stop(*_: object) -> None:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()

    import uvicorn

    # uvicorn re-raises SIGTERM after its graceful shutdown; exit through `finally` so the worker is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    err.print(f"ftplane API on http://{settings.host}:{settings.port} (docs at /docs)")
    try:
        uvicorn.run(
            "api.main:create_served_app",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=workers,
            log_level=settings.log_level.lower(),
            # node agents report every 1-30 s on one kept connection; uvicorn's default closes it after 5 s idle
            timeout_keep_alive=KEEP_ALIVE_S,
            access_log=settings.access_log,
        )
    finally:
        stop()


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
    table = Table("ID", "NAME", "STATUS", "BACKEND", "ATTEMPT", "CREATED", "REASON")
    for job in page["items"]:
        table.add_row(
            job["id"],
            job["name"],
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
    console.print(f"[bold]{job['name']}[/bold]  {job['id']}")
    console.print(f"status: {job['status']}  {job.get('status_reason') or ''}")
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
        console.print("  " + fmt_event(event), highlight=False)


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
                console.print(fmt_event(event), highlight=False)
            cursor = event["id"]
        sys.stdout.flush()
        if page["next_cursor"]:
            continue
        if not follow or call(api.job, job_id)["status"] in TERMINAL and not page["items"]:
            return
        time.sleep(1.0)


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


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="What the token is for.")] = "admin",
    output: OutputOpt = Output.table,
) -> None:
    """Create an admin token (written to the database directly: no token needed to make the first one)."""
    from api.core.db import session_scope, upgrade_to_head
    from api.models import tokens

    upgrade_to_head()
    with session_scope() as session:
        row, token = tokens.create_admin(session, name)
        token_id = row.id
    if output == Output.json:
        print_json({"id": token_id, "name": name, "role": "admin", "token": token})
    else:
        console.print(f"admin token {token_id} ({name}), shown once:")
        sys.stdout.write(token + "\n")


def main() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    app()


if __name__ == "__main__":
    main()
