"""Where this process sits in the job, and the process group it trains in.

Under ft_launcher (or torchrun) the usual variables say who we are (RANK,
WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT).
Without them the trainer runs as a one-rank job on a free local port.

Ports: the process group rendezvous in a TCPStore on MASTER_PORT that rank 0
hosts and that lives as long as the process (one PrefixStore per in-process
restart iteration); NVRx's in-process Wrapper gets a free port of its own, which
the ranks agree on through that store (trainer/nvrx/inprocess_restart.py).
ft_launcher hands workers `MASTER_ADDR=localhost`-style addresses, so a
multi-node job passes rank 0's reachable address in FTPLANE_MASTER_ADDR.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ftplane.trainer.config import Config

log = logging.getLogger(__name__)

CPU_COLLECTIVE_TIMEOUT_S = 10.0
CUDA_COLLECTIVE_TIMEOUT_S = 600.0
STORE_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Placement:
    """This process's place in the job (fixed for the life of the process)."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    restart_count: int  # ft_launcher's worker-group restarts so far
    device: torch.device
    backend: str
    collective_timeout_s: float

    @classmethod
    def from_environment(cls, cfg: Config) -> Placement:
        env = os.environ
        if "MASTER_PORT" not in env:  # standalone: a one-rank job on this machine
            env.setdefault("RANK", "0")
            env.setdefault("WORLD_SIZE", "1")
            env.setdefault("LOCAL_RANK", "0")
            env["MASTER_PORT"] = str(_free_port())
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        master_addr = cfg.master_addr or env["MASTER_ADDR"]

        local_rank = int(env.get("LOCAL_RANK", "0"))
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        if use_cuda:
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            # NCCL for the training collectives, gloo for CPU-side ones (checkpoint planning).
            backend = "cpu:gloo,cuda:nccl"
            default_timeout = CUDA_COLLECTIVE_TIMEOUT_S
        else:
            device = torch.device("cpu")
            backend = "gloo"
            # gloo cannot abort a collective: a rank waiting on a failed peer leaves only when this
            # timeout expires, which must come before the in-process Wrapper's soft timeout.
            default_timeout = CPU_COLLECTIVE_TIMEOUT_S
            if cfg.inprocess:
                default_timeout = min(default_timeout, cfg.inprocess_soft_timeout_s / 2)
                if cfg.collective_timeout_s and cfg.collective_timeout_s >= cfg.inprocess_soft_timeout_s:
                    log.warning(
                        "collective timeout %.0f s >= in-process soft timeout %.0f s: on CPU a rank "
                        "waiting on a failed peer will be terminated instead of restarted in process",
                        cfg.collective_timeout_s,
                        cfg.inprocess_soft_timeout_s,
                    )
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=local_rank,
            master_addr=master_addr,
            master_port=int(env["MASTER_PORT"]),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            device=device,
            backend=backend,
            collective_timeout_s=cfg.collective_timeout_s or default_timeout,
        )


def create_store(placement: Placement) -> dist.TCPStore:
    """The rendezvous store of every process group this process will create (rank 0 hosts it)."""
    return dist.TCPStore(
        host_name=placement.master_addr,
        port=placement.master_port,
        world_size=placement.world_size,
        is_master=placement.rank == 0,
        timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S),
        wait_for_workers=True,
        multi_tenant=True,
    )


def init_process_group(placement: Placement, store: dist.Store, iteration: int) -> tuple[int, int]:
    """Create the default process group for one training iteration; returns (rank, world_size).

    RANK and WORLD_SIZE are read again each time: NVRx's Wrapper may reassign
    them between in-process restart iterations.
    """
    rank = int(os.environ.get("RANK", placement.rank))
    world_size = int(os.environ.get("WORLD_SIZE", placement.world_size))
    dist.init_process_group(
        backend=placement.backend,
        store=dist.PrefixStore(f"ftplane/pg/{iteration}", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=placement.collective_timeout_s),
        device_id=placement.device if placement.device.type == "cuda" else None,
    )
    return rank, world_size


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
