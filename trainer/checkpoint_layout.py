"""The layout of a checkpoint directory: `step-<8 digits>/` per checkpoint, what makes one complete, which job
owns it, and deleting the ones a job no longer keeps (see trainer/checkpoint.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COMPLETE_MARKER = "ftplane-complete.json"
OWNER_FILE = "ftplane-owner.json"
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


@dataclass(frozen=True)
class CheckpointInfo:
    step: int
    path: Path
    complete: bool
    owner: str | None = None  # the job that wrote it (None: written outside a job, or before owners were kept)


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file() and (path / ".metadata").is_file()


def owner_of(path: Path) -> str | None:
    """The job that wrote the checkpoint: its owner file's, else its complete marker's."""
    for name in (OWNER_FILE, COMPLETE_MARKER):
        try:
            owner = json.loads((path / name).read_text()).get("job_id")
        except (OSError, ValueError, AttributeError):
            continue
        if owner is not None:
            return str(owner)
    return None


def list_checkpoints(root: Path) -> list[CheckpointInfo]:
    """Every step directory under root, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR.match(entry.name)
        if match and entry.is_dir():
            found.append(CheckpointInfo(int(match.group(1)), entry, is_complete(entry), owner_of(entry)))
    return sorted(found, key=lambda c: c.step)


def latest_complete(root: Path) -> CheckpointInfo | None:
    complete = [c for c in list_checkpoints(root) if c.complete]
    return complete[-1] if complete else None


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def rotate(root: Path, keep: int, owner: str | None = None) -> list[Path]:
    """Delete `owner`'s complete checkpoints beyond its newest `keep`, and its incomplete ones older than its newest
    complete one (dead: nothing will finish them). Newer incomplete ones may still be being written. Another job's
    checkpoints are never touched."""
    checkpoints = [c for c in list_checkpoints(root) if c.owner == owner]
    complete = [c for c in checkpoints if c.complete]
    if not complete:
        return []
    newest = complete[-1].step
    doomed = [c.path for c in complete[:-keep]] if keep > 0 else []
    doomed += [c.path for c in checkpoints if not c.complete and c.step < newest]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def write_json(path: Path, name: str, record: dict[str, Any]) -> None:
    tmp = path / f".{name}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / name)
