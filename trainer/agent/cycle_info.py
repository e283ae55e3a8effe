"""ft_launcher's per-cycle records (NVRx 0.7 and later): which nodes were active and which stood by in each cycle,
and when the cycle began and ended, as data rather than log lines.

Given `--ft-cycle-info-dir DIR`, the launcher on the rendezvous host writes one JSON file per cycle,
`DIR/cycle_info.<job>.<attempt>.<cycle>` (NVRx's NVRxCycleInfo message: job_id, attempt_index,
cycle_number, cycle_start_time, cycle_end_time, active_nodes, standby_nodes, active_ranks, generation),
and rewrites it, generation + 1, when the cycle ends. Node lists are in Slurm's range form
("node-[0-3]"). The agent passes the flag where the installed NVRx has it (0.4.1 does not) and reads
the directory as it reports; it reads only JSON, never NVRx's code.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FILE_GLOB = "cycle_info.*"
MAX_RECORD_BYTES = 64 * 1024


def supported() -> bool:
    """Whether the installed NVRx writes cycle records (looked up on disk: importing NVRx would import torch)."""
    spec = importlib.util.find_spec("nvidia_resiliency_ext")
    if spec is None or not spec.submodule_search_locations:
        return False
    writer = Path("fault_tolerance") / "cycle_info_writer.py"
    return any((Path(p) / writer).is_file() for p in spec.submodule_search_locations)


def with_cycle_info(command: list[str], directory: Path) -> list[str]:
    """`command` with `--ft-cycle-info-dir` added when it runs ft_launcher and the installed NVRx writes records."""
    if not command or Path(command[0]).name != "ft_launcher" or not supported():
        return command
    return [command[0], f"--ft-cycle-info-dir={directory}", *command[1:]]


@dataclass(frozen=True)
class CycleRecord:
    """One launcher cycle as NVRx recorded it; `ended` empty while the cycle runs."""

    attempt_index: int
    cycle: int
    started: str
    ended: str
    active_nodes: str
    standby_nodes: str
    active_ranks: str
    generation: int

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cycle": self.cycle,
            "source": "nvrx_cycle_info",
            "started_at": self.started,
            "active_nodes": self.active_nodes,
            "standby_nodes": self.standby_nodes,
            "active_ranks": self.active_ranks,
        }
        if self.ended:
            out["ended_at"] = self.ended
        return out


class CycleInfoReader:
    """Reads the records in one directory; `new()` gives each record again only when NVRx rewrote it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._generations: dict[str, int] = {}

    def new(self) -> list[CycleRecord]:
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob(FILE_GLOB)):
            if path.is_symlink() or path.suffix in (".tmp", ".current") or not path.is_file():
                continue
            record = _read(path)
            if record is None or self._generations.get(path.name, -1) >= record.generation:
                continue
            self._generations[path.name] = record.generation
            found.append(record)
        return sorted(found, key=lambda r: (r.attempt_index, r.cycle, r.generation))


def _read(path: Path) -> CycleRecord | None:
    """A record, or None for one that is half written or not NVRx's (logged, never raised)."""
    try:
        if path.stat().st_size > MAX_RECORD_BYTES:
            raise ValueError(f"over {MAX_RECORD_BYTES} bytes")
        body = json.loads(path.read_text())
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        return CycleRecord(
            attempt_index=_integer(body, "attempt_index"),
            cycle=_integer(body, "cycle_number"),
            started=_instant(body, "cycle_start_time"),
            ended=_instant(body, "cycle_end_time"),
            active_nodes=_text(body, "active_nodes"),
            standby_nodes=_text(body, "standby_nodes"),
            active_ranks=_text(body, "active_ranks"),
            generation=_integer(body, "generation"),
        )
    except (OSError, ValueError) as exc:
        log.warning("cycle record %s unreadable: %s", path.name, exc)
        return None


def _integer(body: dict[str, Any], key: str) -> int:
    # protobuf's JSON writes 64-bit integers (generation) as strings, 32-bit ones as numbers
    value = body.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{key} is not an integer")
    number = int(value)
    if number < 0:
        raise ValueError(f"{key} is negative")
    return number


def _instant(body: dict[str, Any], key: str) -> str:
    """An ISO 8601 time in UTC ("" when absent: a cycle not ended yet)."""
    value = _text(body, key)
    if not value:
        return ""
    at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if at.tzinfo is None:
        raise ValueError(f"{key} has no time zone")
    return at.astimezone(UTC).isoformat()


def _text(body: dict[str, Any], key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key} is not a string")
    return value[:4096]
