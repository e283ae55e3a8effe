"""The model sizes and the synthetic data a resumed job must see again."""

from __future__ import annotations

import torch

from ftplane.trainer.config import MODEL_PRESETS
from ftplane.trainer.model import Transformer, count_parameters, synthetic_batch

CPU = torch.device("cpu")


def test_tiny_is_really_tiny_and_runs() -> None:
    model = Transformer(MODEL_PRESETS["tiny"])
    assert 50_000 < count_parameters(model) < 200_000
    inputs, _ = synthetic_batch(MODEL_PRESETS["tiny"], batch_size=2, seed=0, step=0, dp_rank=0, device=CPU)
    assert model(inputs).shape == (2, MODEL_PRESETS["tiny"].seq_len, MODEL_PRESETS["tiny"].vocab_size)


def test_large_is_a_1b_class_model() -> None:
    args = MODEL_PRESETS["large"]
    with torch.device("meta"):
        model = Transformer(args)
    assert 1.0e9 < count_parameters(model) < 2.0e9


def test_data_is_a_function_of_seed_step_and_rank() -> None:
    args = MODEL_PRESETS["tiny"]

    def batch(seed: int, step: int, rank: int) -> torch.Tensor:
        return synthetic_batch(args, batch_size=4, seed=seed, step=step, dp_rank=rank, device=CPU)[0]

    assert torch.equal(batch(1, 17, 1), batch(1, 17, 1))
    assert not torch.equal(batch(1, 17, 1), batch(1, 18, 1))
    assert not torch.equal(batch(1, 17, 1), batch(1, 17, 0))
    assert not torch.equal(batch(1, 17, 1), batch(2, 17, 1))
    inputs, targets = synthetic_batch(args, batch_size=4, seed=1, step=3, dp_rank=0, device=CPU)
    assert torch.equal(inputs[:, 1:], targets[:, :-1]) and int(inputs.max()) < args.vocab_size
