"""Zero-code progress presets: what the frameworks people train with print, as patterns for the node agent.

The job spec's `progress: {preset: NAME}` stands for a `log_pattern` written for one framework, with more
than a step: its total (so progress and ETA work), the step a run resumed from (so the agent's `running`
carries it, and goodput measures recompute), and the environment the ranks need for it. Each pattern is
tested against lines captured from real runs (tests/trainer/agent/captured/: Lightning and Transformers
run here on the CPU; torchtitan's and Megatron-LM's lines are made from their sources' format strings).

lightning     Lightning's progress bar counts batches within the epoch, on rank 0, and writes nothing
              per step where the output is not a terminal. The preset sets FTPLANE_PROGRESS_PRESET for
              the ranks, and ftplane's Lightning entry point then adds `StepLog` to every Trainer
              (trainer/sdk/lightning.py): one line `[ftplane] global_step=N total=T` as training starts
              (the step it resumed from) and at most once a second after, on every rank. Its cost: ftplane
              installed where the ranks run, and about one line a second in each rank's output.
transformers  The Trainer's progress bar (tqdm, rank 0): `37%|███▋ | 11/30 [00:01<00:02, ...]`, the global
              step and its total (torchelastic's tee splits tqdm's carriage returns into lines). Bars of
              another total (evaluation, writing model shards) are not the training's, and a bar at 0 is
              one just made. The preset sets TRANSFORMERS_VERBOSITY=info for the ranks (unless the spec's
              `env` sets it), so that rank 0 also says `Total optimization steps = T` and `Resuming training
              from checkpoint with epoch E and global step S`; its cost: the Trainer's info lines (some
              thirty at start, a few per checkpoint) in rank 0's output.
torchtitan    `step: 21  loss: ...` every `metrics.log_freq` steps (`validate step:` lines are not training
              steps), `Training starts at step 21` (the run resumes from step 20) and `total steps 1000` in
              the trainer's first line.
megatron      ` iteration       21/     500 | consumed samples: ...` on the last rank, and on rank 0
              `successfully loaded checkpoint from ... at iteration 20`, then `[before the start of training
              step]` as training starts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ftplane.contract import PROGRESS_PRESETS


@dataclass(frozen=True)
class Preset:
    """What to read in a framework's output. Group names: `step` (steps done), `total` (the run's steps), `next`
    (the step about to run: the run resumed from the one before)."""

    name: str
    step: re.Pattern[str]  # a line with the steps done (group step) and maybe the total (group total)
    total: re.Pattern[str] | None = None  # a line with the total alone
    resumes: re.Pattern[str] | None = None  # a line with the step the run resumes from (group step or next)
    begins: re.Pattern[str] | None = None  # training begins: at step 0 unless a `resumes` line says otherwise
    settles_at_begin: bool = False  # `begins` comes after `resumes` (else the first step settles it)
    first_is_start: bool = False  # the first `step` line of a run is the step it resumed from
    bar: bool = False  # `step` lines are a progress bar: 0 is a new bar, a bar of another total is not training's
    environment: dict[str, str] = field(default_factory=dict)  # for the ranks (the spec's `env` wins)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "lightning",
            step=re.compile(r"\[ftplane\] global_step=(?P<step>\d+)(?: total=(?P<total>\d+))?"),
            first_is_start=True,
        ),
        Preset(
            "transformers",
            step=re.compile(r"^\s*\d+%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+) \["),
            total=re.compile(r"Total optimization steps = (?P<total>[\d,]+)"),
            resumes=re.compile(
                r"(?:Resuming training from checkpoint with epoch \d+ and|Continuing training from) "
                r"global step (?P<step>\d+)"
            ),
            begins=re.compile(r"\*\*\*\*\* Running training \*\*\*\*\*"),
            bar=True,
            environment={"TRANSFORMERS_VERBOSITY": "info"},
        ),
        Preset(
            "torchtitan",
            step=re.compile(r"(?<!validate )step:\s*(?P<step>\d+)\s.*loss:"),
            total=re.compile(r"Trainer is initialized with .*total steps (?P<total>\d+)"),
            resumes=re.compile(r"Training starts at step (?P<next>\d+)"),
        ),
        Preset(
            "megatron",
            step=re.compile(r"iteration\s+(?P<step>\d+)/\s*(?P<total>\d+) \|"),
            resumes=re.compile(r"successfully loaded checkpoint from .* at iteration (?P<step>\d+)"),
            begins=re.compile(r"\[before the start of training step\]"),
            settles_at_begin=True,
        ),
    )
}
assert set(PRESETS) == set(PROGRESS_PRESETS), "the contract names every preset, and only those"
