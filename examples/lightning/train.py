"""A PyTorch Lightning script as a user writes it: DDP over every rank, `ModelCheckpoint(save_last=True)`,
`fit(ckpt_path="last")`, and ftplane's callback in one line (left out with --zero-code).

A small MLP learns a fixed random linear map from synthetic data (nothing is downloaded): gloo on
the CPU, NCCL when CUDA is there. Lightning saves a checkpoint every few steps and `last.ckpt`; a
(re)started run resumes from it, as after an in-job restart. Run it under any launcher:

    torchrun --nproc-per-node=2 examples/lightning/train.py --steps 40 --checkpoint-dir /tmp/ckpt
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all (max_steps)")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank per step")
    parser.add_argument("--batches-per-epoch", type=int, default=20, help="an epoch's batches per rank")
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="extra sleep per step (to watch it run)")
    parser.add_argument("--checkpoint-dir", required=True, help="where ModelCheckpoint writes (and resumes from)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="a checkpoint every N steps")
    parser.add_argument("--zero-code", action="store_true", help="no ftplane callback: the script as it was")
    return parser.parse_args()


class Regression(pl.LightningModule):
    def __init__(self, step_delay_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.step_delay_s = step_delay_s

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        self.log("loss", loss)
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        inputs, targets = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(inputs), targets), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def synthetic(samples: int, seed: int) -> TensorDataset:
    """Inputs and the targets of a fixed linear map: the same seed always gives the same data."""
    inputs = torch.randn(samples, 16, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(inputs, inputs @ torch.linspace(-1, 1, 16).unsqueeze(1))


def main() -> None:
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    torch.manual_seed(0)
    train = DataLoader(synthetic(args.batch_size * args.batches_per_epoch * world, 0), batch_size=args.batch_size)
    val = DataLoader(synthetic(args.batch_size * 2 * world, 1), batch_size=args.batch_size)

    callbacks: list[Callback] = [
        ModelCheckpoint(dirpath=args.checkpoint_dir, every_n_train_steps=args.checkpoint_every, save_last=True)
    ]
    if not args.zero_code:
        from ftplane.sdk.lightning import FtplaneCallback

        callbacks.append(FtplaneCallback(tokens_per_step=args.batch_size))  # ftplane: the one line
    trainer = pl.Trainer(
        accelerator="auto",
        devices=local,
        num_nodes=world // local,
        strategy="ddp" if world > 1 else "auto",
        max_steps=args.steps,
        callbacks=callbacks,
        log_every_n_steps=5,
        enable_model_summary=False,
    )
    fit: dict[str, Any] = {"ckpt_path": "last"}  # resume from last.ckpt when there is one
    trainer.fit(Regression(args.step_delay_s), train, val, **fit)


if __name__ == "__main__":
    main()
