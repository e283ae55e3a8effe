"""A small decoder-only transformer and the synthetic token stream it learns.

The data is a pure function of (seed, step, data-parallel rank), so a job that
resumes from the checkpoint of step N sees exactly the batches an
uninterrupted job would have seen from step N on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ftplane.trainer.config import ModelArgs


class Attention(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads = args.n_heads
        self.qkv = nn.Linear(args.dim, 3 * args.dim, bias=False)
        self.out = nn.Linear(args.dim, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, dim // self.n_heads).unbind(dim=2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, seq, dim))
        return out


class FeedForward(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        hidden = args.ffn_mult * args.dim
        self.up = nn.Linear(args.dim, hidden, bias=False)
        self.down = nn.Linear(hidden, args.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.silu(self.up(x)))
        return out


class Block(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(args.dim)
        self.attn = Attention(args)
        self.ffn_norm = nn.RMSNorm(args.dim)
        self.ffn = FeedForward(args)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        out: torch.Tensor = x + self.ffn(self.ffn_norm(x))
        return out


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        if args.dim % args.n_heads:
            raise ValueError(f"dim {args.dim} is not divisible by n_heads {args.n_heads}")
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.pos_embeddings = nn.Embedding(args.seq_len, args.dim)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.output(self.norm(x))
        return logits


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def synthetic_batch(
    args: ModelArgs, *, batch_size: int, seed: int, step: int, dp_rank: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for one rank at one step.

    Each sequence counts up from a random start by a random stride (mod the
    vocabulary), so the loss falls as the model learns the pattern.
    """
    mixed = ((seed * 0x9E37_79B1 + step) * 0x85EB_CA77 + dp_rank) & 0x7FFF_FFFF_FFFF_FFFF
    generator = torch.Generator().manual_seed(mixed)
    start = torch.randint(0, args.vocab_size, (batch_size, 1), generator=generator)
    stride = torch.randint(1, 8, (batch_size, 1), generator=generator)
    positions = torch.arange(args.seq_len + 1).unsqueeze(0)
    tokens = (start + stride * positions) % args.vocab_size
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]
