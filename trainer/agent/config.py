"""The node agent's configuration: from the environment the backend gives it, and the paths it uses."""

from __future__ import annotations

import hashlib
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ftplane import contract
from ftplane.contract import PROGRESS_PRESETS, Env

MAX_LOG_PATTERN = 512


@dataclass(frozen=True)
class AgentConfig:
    command: list[str]
    url: str | None
    job_id: str | None
    attempt: int
    token: str | None
    node: str
    run_dir: Path
    interval_s: float = 1.0
    log_pattern: str | None = None
    preset: str | None = None  # a zero-code progress preset (trainer/agent/presets.py)
    echo_output: bool = False  # copy the launcher's output to the agent's own stdout (container logs)
    stop_grace_s: float = 10.0  # after passing SIGTERM on, how long the launcher and ranks get before SIGKILL
    log_max_bytes: int = contract.LOG_MAX_BYTES  # each rank's kept output (rank_logs.py)

    @classmethod
    def from_environment(cls, command: list[str], environ: dict[str, str] | None = None) -> AgentConfig:
        env = dict(os.environ if environ is None else environ)
        job_id = env.get(Env.JOB_ID)
        attempt = int(env.get(Env.ATTEMPT, "0"))
        node = env.get(Env.NODE_NAME) or socket.gethostname()
        default_dir = Path(env.get("TMPDIR", "/tmp")) / f"ftplane-agent-{job_id or 'standalone'}-a{attempt}-{node}"
        pattern = env.get(Env.LOG_PATTERN) or None
        if pattern is not None:
            check_log_pattern(pattern)
        preset = env.get(Env.PROGRESS_PRESET) or None
        if preset is not None and preset not in PROGRESS_PRESETS:
            raise ValueError(f"{Env.PROGRESS_PRESET}={preset!r}: not one of {', '.join(PROGRESS_PRESETS)}")
        return cls(
            command=command,
            url=env.get(Env.URL) or None,
            job_id=job_id,
            attempt=attempt,
            token=env.get(Env.TOKEN) or None,
            node=node,
            run_dir=Path(env.get(Env.AGENT_DIR) or default_dir),
            interval_s=float(env.get(Env.REPORT_INTERVAL_S, "1.0")),
            log_pattern=pattern,
            preset=preset,
            echo_output=env.get(Env.AGENT_ECHO, "0") == "1",
            stop_grace_s=float(env.get(Env.STOP_GRACE_S) or 10.0),
            log_max_bytes=log_bound(env.get(Env.LOG_MAX_BYTES)),
        )


def log_bound(value: str | None) -> int:
    """FTPLANE_LOG_MAX_BYTES: bytes of output kept per rank (default contract.LOG_MAX_BYTES)."""
    if not value:
        return contract.LOG_MAX_BYTES
    try:
        bound = int(value)
    except ValueError:
        raise ValueError(f"{Env.LOG_MAX_BYTES} must be a number of bytes, not {value!r}") from None
    if bound < contract.LOG_MIN_BYTES:
        raise ValueError(f"{Env.LOG_MAX_BYTES} must be at least {contract.LOG_MIN_BYTES} bytes, not {bound}")
    return bound


def check_log_pattern(pattern: str) -> re.Pattern[str]:
    """The rule the spec's progress.log_pattern obeys (the API refuses the same with a 422)."""
    if len(pattern) > MAX_LOG_PATTERN:
        raise ValueError(f"log pattern is longer than {MAX_LOG_PATTERN} characters")
    compiled = re.compile(pattern)
    if "step" not in compiled.groupindex:
        raise ValueError("log pattern has no named group 'step', e.g. 'step (?P<step>\\d+)'")
    return compiled


MAX_SOCKET_PATH = 100  # a Unix socket's path must fit in 108 bytes


def socket_path(run_dir: Path) -> Path:
    """The channel's socket: in the run directory, or (where that path is too long for a Unix socket) in a
    private directory of its own under the system's temporary directory."""
    path = run_dir / "agent.sock"
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path
    short = Path(tempfile.gettempdir()) / f"ftplane-{hashlib.sha256(os.fsencode(run_dir)).hexdigest()[:16]}"
    short.mkdir(mode=0o700, exist_ok=True)
    return short / "agent.sock"
