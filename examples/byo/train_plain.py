"""A plain torch.distributed training script, with no ftplane code: what a user brings.

A small MLP learns a fixed random linear map, data-parallel (DDP) over every rank: gloo on the
CPU, NCCL when CUDA is there. Each rank prints `step N loss X` after each step; rank 0 saves a
checkpoint every few steps and every rank resumes from the newest one when (re)started, as
after an in-job restart. Run it under any launcher:

    torchrun --nproc-per-node=2 examples/byo/train_plain.py --steps 40
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps in all")
    parser.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="extra sleep per step (to watch it run)")
    parser.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (none: no checkpoints)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="save every N steps")
    return parser.parse_args()


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic data: the same step and rank always get the same batch (restarts redo the same work)."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, 16, generator=generator)
    weights = torch.linspace(-1, 1, 16).unsqueeze(1)
    return inputs.to(device), (inputs @ weights).to(device)


def load_checkpoint(directory: str | None, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Resume from the newest checkpoint, if any; returns its step (0: none)."""
    path = os.path.join(directory, "latest.pt") if directory else None
    if path is None or not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def save_checkpoint(
    directory: str, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[float, int]:
    """Rank 0 writes `latest.pt` (atomically); returns (seconds it took, bytes written)."""
    started = time.perf_counter()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "latest.pt")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)
    return time.perf_counter() - started, os.path.getsize(path)


def main() -> None:
    args = parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    start_step = load_checkpoint(args.checkpoint_dir, model, optimizer)
    if start_step:
        print(f"resumed from step {start_step}", flush=True)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)

    for step in range(start_step, args.steps):
        inputs, targets = batch(step, rank, args.batch_size, device)
        loss = torch.nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
        if args.step_delay_s:
            time.sleep(args.step_delay_s)
        print(f"step {step + 1} loss {loss_value:.4f}", flush=True)
        if rank == 0 and args.checkpoint_dir and (step + 1) % args.checkpoint_every == 0:
            seconds, size = save_checkpoint(args.checkpoint_dir, step + 1, model, optimizer)
            print(f"checkpoint of step {step + 1} saved in {seconds:.3f} s ({size} bytes)", flush=True)

    # DDP's reducer holds the process group: free it first, or the group's gloo threads are torn down at
    # interpreter exit, which now and then aborted the rank (SIGABRT after its last step).
    del ddp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
