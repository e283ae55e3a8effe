"""`ftplane serve`: run the control plane on this host (the API, the worker and beat, together or one part),
on embedded defaults, with a first admin token for the CLI."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ftplane.client import ADMIN_TOKEN_FILE
from ftplane.restarting import RestartingChild
from ftplane.terminal import err, fail

KEEP_ALIVE_S = 75  # longer than a node agent's keep-alive (60 s), so the agent, not the server, closes
# Connections the kernel completes while the API's workers are busy elsewhere: every agent of a job connects at its
# start and after a restart, 16,384 of them for a 131,072-GPU job. Past the backlog a connect is dropped and sent
# again after 1 s, then 3 s: the second is past the agents' 2 s connect timeout. uvicorn's default is 2,048; the
# kernel caps this at net.core.somaxconn (4,096 on current kernels). The 131,072-rank scale story on two cores
# overflowed it still (bench/RESULTS.md, scale, 2026-12-07).
LISTEN_BACKLOG = 16_384


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
    from api import models
    from api.core.config import get_settings
    from api.core.db import session_scope

    settings = get_settings()
    path = Path(settings.data_dir) / ADMIN_TOKEN_FILE
    if settings.database_url or path.exists():
        return
    with session_scope() as session:
        if any(t.role == "cluster-admin" and t.revoked_at is None for t in models.tokens.list_tokens(session)):
            return
        _, token = models.tokens.create_admin(session, "bootstrap (ftplane serve)")
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
    """The worker (with embedded beat for `all`) or beat process of `ftplane serve` (`-P`, and workers/__main__.py:
    the directory it runs in, perhaps a user's repository with its own `workers/`, is not put on the import path)."""
    base = [sys.executable, "-P", "-m", "workers"]
    if part == Part.beat:
        return [*base, "beat", f"--loglevel={loglevel}"]
    command = [*base, "worker", f"--loglevel={loglevel}", "--pool=solo", "--without-gossip", "--without-mingle"]
    if part == Part.all:
        command.append("--beat")
    return command


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
    from api.core import queue
    from api.core.config import get_settings
    from api.core.db import upgrade_to_head

    get_settings.cache_clear()
    settings = get_settings()
    if not settings.auth_enabled and not is_loopback(settings.host):
        fail(f"FTPLANE_AUTH=disabled is refused on the non-loopback address {settings.host}: enable auth")
    upgrade_to_head(settings)
    queue.prepare_embedded_broker(settings)
    if only == Part.all and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        # API and worker are separate processes on this host: /metrics sums both (restarts are counted
        # by the worker's supervisor). Stale files of an earlier run would be summed too, so start empty.
        metrics_dir = (Path(settings.data_dir) / "prometheus").resolve()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    if only in (Part.all, Part.api):
        bootstrap_admin_token()
    if only in (Part.worker, Part.beat):
        os.execv(sys.executable, celery_command(only))
    # the worker (with beat) is started again if it exits: without it nothing would supervise the jobs
    worker = RestartingChild(celery_command(Part.all), "worker", die_with_parent) if only == Part.all else None

    import uvicorn

    from api.core.arrival import PROTOCOL

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
            backlog=LISTEN_BACKLOG,
            http=PROTOCOL,  # stamps when each request came, for the report route's lateness
            access_log=settings.access_log,
        )
    finally:
        if worker is not None:
            worker.stop()
