"""A Hugging Face `Trainer` script as a user writes it: a tiny GPT-2 built from its config, data-parallel
(DDP) over every rank, a checkpoint every few steps, resumed from the newest one; ftplane's callback in
one line (left out with --zero-code).

The model is made from a config and the data is synthetic token sequences: nothing is downloaded.
gloo on the CPU, NCCL when CUDA is there. Run it under any launcher:

    torchrun --nproc-per-node=2 examples/transformers/train.py --steps 40 --output-dir /tmp/out
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps in all (max_steps)")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--sequence", type=int, default=32, help="tokens per sequence")
    parser.add_argument("--step-delay-s", type=float, default=0.0, help="extra sleep per step (to watch it run)")
    parser.add_argument("--output-dir", required=True, help="where the Trainer writes checkpoint-N (and resumes)")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="a checkpoint every N steps")
    parser.add_argument("--eval-every", type=int, default=0, help="an evaluation every N steps (0: none)")
    parser.add_argument("--zero-code", action="store_true", help="no ftplane callback: the script as it was")
    return parser.parse_args()


class TokenSequences(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Deterministic random token sequences (item i is always the same), as inputs and labels."""

    def __init__(self, count: int, length: int, vocabulary: int) -> None:
        self.count, self.length, self.vocabulary = count, length, vocabulary

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        tokens = torch.randint(self.vocabulary, (self.length,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": tokens, "labels": tokens}


class Delay(TrainerCallback):  # type: ignore[misc]
    """Sleeps after each step, so a tiny model's run lasts long enough to watch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def main() -> None:
    args = parse_args()
    config = GPT2Config(vocab_size=256, n_positions=args.sequence, n_embd=32, n_layer=2, n_head=2)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=args.checkpoint_every,
        save_total_limit=2,
        logging_steps=5,
        eval_strategy="steps" if args.eval_every else "no",
        eval_steps=args.eval_every or None,
        per_device_eval_batch_size=args.batch_size,
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
    )
    callbacks: list[TrainerCallback] = [Delay(args.step_delay_s)] if args.step_delay_s else []
    if not args.zero_code:
        from ftplane.sdk.transformers import FtplaneCallback

        callbacks.append(FtplaneCallback())  # ftplane: the one line
    data = TokenSequences(args.steps * args.batch_size * 8, args.sequence, config.vocab_size)
    held_out = TokenSequences(args.batch_size * 4, args.sequence, config.vocab_size) if args.eval_every else None
    trainer = Trainer(model=model, args=training, train_dataset=data, eval_dataset=held_out, callbacks=callbacks)
    resume = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
