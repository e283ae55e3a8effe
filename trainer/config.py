"""The trainer's configuration: one typed dataclass, filled from the environment, then the command line.

Each field may name the environment variable the control plane sets for it
(`FTPLANE_*`); a command-line flag (`--field-name`) overrides the environment,
so `python -m ftplane.trainer --model tiny --steps 20` runs standalone with no
environment at all. What says who the process reports for (job, attempt, the
node agent's socket, injected faults) is the SDK's to read (trainer/sdk), not
this file's: the built-in trainer reports through the SDK like any other
training script. The job's token never reaches the ranks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from ftplane.contract import Env

CheckpointEngine = Literal["sync", "async", "none"]
CHECKPOINT_ENGINES: tuple[str, ...] = get_args(CheckpointEngine)


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is allowed."""


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    seq_len: int
    ffn_mult: int = 4


# Sizes from a CPU smoke test to a 1B-class model for a GPU node.
MODEL_PRESETS: dict[str, ModelArgs] = {
    # ~135k parameters: two CPU ranks run tens of steps per second.
    "tiny": ModelArgs(vocab_size=256, dim=64, n_layers=2, n_heads=4, seq_len=64),
    # ~20M parameters.
    "small": ModelArgs(vocab_size=32000, dim=256, n_layers=4, n_heads=4, seq_len=256),
    # ~160M parameters (GPT-2 small shape).
    "medium": ModelArgs(vocab_size=32000, dim=768, n_layers=12, n_heads=12, seq_len=1024),
    # ~1.3B parameters.
    "large": ModelArgs(vocab_size=32000, dim=2048, n_layers=24, n_heads=16, seq_len=2048),
}


def _env(name: str) -> dict[str, Any]:
    return {"env": name}


@dataclass
class Config:
    # --- model and data ---
    model: str = field(default="tiny", metadata={"help": f"model size: {', '.join(MODEL_PRESETS)}"})
    steps: int = field(default=100, metadata={"help": "total optimizer steps of the job"})
    batch_size: int = field(default=8, metadata={"help": "sequences per rank per step"})
    seq_len: int | None = field(default=None, metadata={"help": "tokens per sequence (default: the preset's)"})
    lr: float = field(default=3e-3, metadata={"help": "AdamW learning rate (constant)"})
    seed: int = field(default=1234, metadata={"help": "seed of the initial weights and of the synthetic data"})
    device: str = field(default="auto", metadata={"help": "auto (CUDA when present) | cpu | cuda"})
    step_delay_s: float = field(
        default=0.0, metadata={"help": "extra sleep per step, to stretch a CPU job (demos, tests)"}
    )
    log_every: int = field(default=10, metadata={"help": "log a line every N steps (rank 0)"})
    metrics_file: str | None = field(
        default=None,
        metadata={"help": "append one JSON line per step to this file; '{rank}' is replaced by the rank"},
    )
    # --- checkpointing ---
    checkpoint_dir: str | None = field(
        default=None,
        metadata={**_env(Env.CHECKPOINT_DIR), "help": "shared checkpoint directory"},
    )
    checkpoint_engine: str = field(
        default="sync", metadata={**_env(Env.CHECKPOINT_ENGINE), "help": "sync | async | none"}
    )
    checkpoint_interval: int = field(
        default=100, metadata={**_env(Env.CHECKPOINT_INTERVAL), "help": "save every N steps"}
    )
    checkpoint_keep: int = field(
        default=2, metadata={**_env(Env.CHECKPOINT_KEEP), "help": "complete checkpoints kept on disk"}
    )
    # --- NVRx in-process restart ---
    inprocess: bool = field(
        default=False, metadata={**_env(Env.INPROCESS), "help": "wrap training in inprocess.Wrapper"}
    )
    inprocess_soft_timeout_s: float = field(default=60.0, metadata=_env(Env.INPROCESS_SOFT_TIMEOUT_S))
    inprocess_hard_timeout_s: float = field(default=90.0, metadata=_env(Env.INPROCESS_HARD_TIMEOUT_S))
    inprocess_max_iterations: int = field(
        default=10,
        metadata={
            **_env(Env.INPROCESS_MAX_ITERATIONS),
            "help": "in-process restarts allowed per process",
        },
    )
    collective_timeout_s: float | None = field(
        default=None,
        metadata={
            **_env("FTPLANE_COLLECTIVE_TIMEOUT_S"),
            "help": "process-group timeout (default: 10 s on CPU/gloo, 600 s on CUDA/NCCL)",
        },
    )
    # --- the process group ---
    master_addr: str | None = field(
        default=None,
        metadata={
            **_env(Env.MASTER_ADDR),
            "help": "rendezvous address of rank 0 for the process group (overrides MASTER_ADDR)",
        },
    )

    @property
    def model_args(self) -> ModelArgs:
        args = MODEL_PRESETS[self.model]
        if self.seq_len is not None:
            args = dataclasses.replace(args, seq_len=self.seq_len)
        return args

    def validate(self) -> Config:
        def bad(name: str, problem: str) -> ConfigError:
            return ConfigError(f"{name}: {problem}")

        if self.model not in MODEL_PRESETS:
            raise bad("model", f"{self.model!r} is not one of {', '.join(MODEL_PRESETS)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise bad("device", f"{self.device!r} is not one of auto, cpu, cuda")
        if self.checkpoint_engine not in CHECKPOINT_ENGINES:
            raise bad(
                f"checkpoint_engine ({Env.CHECKPOINT_ENGINE})",
                f"{self.checkpoint_engine!r} is not one of {', '.join(CHECKPOINT_ENGINES)}",
            )
        for name in (
            "steps",
            "batch_size",
            "checkpoint_interval",
            "checkpoint_keep",
            "inprocess_max_iterations",
        ):
            if getattr(self, name) < 1:
                raise bad(name, "must be at least 1")
        if self.seq_len is not None and self.seq_len < 2:
            raise bad("seq_len", "must be at least 2")
        if not 1.0 <= self.inprocess_soft_timeout_s < self.inprocess_hard_timeout_s:
            raise bad(
                "inprocess_soft_timeout_s",
                "must be >= 1 s and less than inprocess_hard_timeout_s "
                f"(got {self.inprocess_soft_timeout_s} and {self.inprocess_hard_timeout_s})",
            )
        if self.collective_timeout_s is not None and self.collective_timeout_s <= 0:
            raise bad("collective_timeout_s", "must be positive")
        return self


# --- parsing --------------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 1/0/true/false, got {text!r}")


def _base_type(annotation: Any) -> Any:
    """`int | None` -> int; other annotations unchanged."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _convert(name: str, annotation: Any, text: str) -> Any:
    base = _base_type(annotation)
    optional = base is not annotation
    if optional and text.strip().lower() in ("", "none"):
        return None
    if base is bool:
        return _parse_bool(text)
    if base in (int, float, str):
        return base(text)
    raise TypeError(f"no parser for {name}: {annotation}")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Defaults, then `FTPLANE_*` variables, then command-line flags; validated."""
    environ = os.environ if environ is None else environ
    hints = get_type_hints(Config)
    fields = dataclasses.fields(Config)

    values: dict[str, Any] = {}
    for f in fields:
        env_name = f.metadata.get("env")
        if env_name and environ.get(env_name, "") != "":
            try:
                values[f.name] = _convert(f.name, hints[f.name], environ[env_name])
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{env_name}={environ[env_name]!r}: {exc}") from exc

    parser = argparse.ArgumentParser(
        prog="python -m ftplane.trainer",
        description="FSDP2 training of a small decoder-only transformer on synthetic tokens, "
        "with NVRx fault tolerance, reporting to the ftplane control plane through its node agent.",
    )
    for f in fields:
        env_name = f.metadata.get("env")
        help_text = f.metadata.get("help", "")
        if env_name:
            help_text = f"{help_text} [env {env_name}]".strip()
        parser.add_argument(_flag(f.name), dest=f.name, metavar=f.name.upper(), default=None, help=help_text)
    args = parser.parse_args(argv)
    for f in fields:
        text = getattr(args, f.name)
        if text is not None:
            try:
                values[f.name] = _convert(f.name, hints[f.name], text)
            except (ValueError, TypeError) as exc:
                parser.error(f"{_flag(f.name)} {text!r}: {exc}")
    return Config(**values).validate()
