"""What the backend, the node agent and the launcher tell a rank about itself, read from its environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ftplane.contract import Env
from ftplane.trainer.agent.protocol import SOCKET_ENV
from ftplane.trainer.faults import FaultSpec, parse_faults

FT_RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"  # set by ft_launcher for its workers


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "")
    if text == "":
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected an integer") from None


@dataclass(frozen=True)
class Environment:
    """What the backend, the node agent and the launcher tell a rank about itself."""

    agent_socket: str | None = None  # FTPLANE_AGENT_SOCKET, set by the node agent
    url: str | None = None  # FTPLANE_URL: the control plane exists (the agent talks to it, never the ranks)
    job_id: str | None = None
    attempt: int = 0
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    restart_count: int = 0  # ft_launcher's worker-group restarts so far
    checkpoint_dir: str | None = None
    faults: list[FaultSpec] = field(default_factory=list)
    rank_monitor: bool = False  # under ft_launcher: its rank monitor listens for heartbeats

    @property
    def reporting(self) -> bool:
        return bool(self.agent_socket and self.url)

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Environment:
        """From FTPLANE_* and the launcher's variables; a malformed value raises ValueError naming it."""
        env = os.environ if environ is None else environ
        return cls(
            agent_socket=env.get(SOCKET_ENV) or None,
            url=env.get(Env.URL) or None,
            job_id=env.get(Env.JOB_ID) or None,
            attempt=_int(env, Env.ATTEMPT, 0),
            rank=_int(env, "RANK", 0),
            local_rank=_int(env, "LOCAL_RANK", 0),
            world_size=_int(env, "WORLD_SIZE", 1),
            restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
            checkpoint_dir=env.get(Env.CHECKPOINT_DIR) or None,
            faults=parse_faults(env.get(Env.FAULTS)),
            rank_monitor=bool(env.get(FT_RANK_MONITOR_ENV)),
        )
