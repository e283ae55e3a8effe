"""What /proc says about the launcher's process tree: which processes are ranks, and whether they live.

Linux only, standard library only. A rank process is a descendant of the launcher whose
environment has `RANK` and whose parent has none (its own children, such as checkpoint writers
or data loader workers, inherit `RANK` and are not ranks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# A process this young may not have exec'd its program yet (its environment is still its parent's): what it is,
# read as "not a rank", is read again until it is older.
EXEC_GRACE_S = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()


def process_start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot (tells a live process from a recycled pid); None when gone."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] == "Z":  # a zombie has ended
        return None
    return int(fields[19])


def is_stopped(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def parent_of(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields is not None else None


def children_of(pid: int) -> list[int] | None:
    """The pid's children from the kernel's own list (no scan of /proc); None where the kernel keeps no list."""
    found: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    for task in tasks:
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            return None
        except (ProcessLookupError, PermissionError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process under `pid`: by the kernel's child lists where there are some, else one scan of /proc."""
    direct = children_of(pid)
    if direct is not None:
        found: list[int] = []
        stack = list(direct)
        while stack:
            child = stack.pop()
            found.append(child)
            stack.extend(children_of(child) or [])
        return found
    return _descendants_by_scan(pid)


def _descendants_by_scan(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


@dataclass(frozen=True)
class RankProcess:
    rank: int
    local_rank: int
    pid: int
    start_time: int
    restart_count: int
    local_world_size: int = 1  # the ranks the launcher starts on this node


def rank_processes(
    launcher_pid: int, known: dict[tuple[int, int], RankProcess | None] | None = None
) -> list[RankProcess]:
    """The rank processes under the launcher now, by global rank. `known` caches what each (pid, start time)
    was found to be, so a process's environment is read once, not on every call."""
    cache: dict[tuple[int, int], RankProcess | None] = {} if known is None else known
    seen: dict[int, RankProcess | None] = {}
    young_since = _ticks_now() - EXEC_GRACE_S * os.sysconf("SC_CLK_TCK")
    for pid in descendants(launcher_pid):
        started = process_start_time(pid)
        if started is None:
            continue
        key = (pid, started)
        if key not in cache or (cache[key] is None and started >= young_since):
            cache[key] = _as_rank(pid, started)
        seen[pid] = cache[key]
    with_rank = {pid for pid, process in seen.items() if process is not None}
    found = [p for pid, p in seen.items() if p is not None and parent_of(pid) not in with_rank]
    for key in [k for k in cache if k[0] not in seen]:  # ended processes
        del cache[key]
    return sorted(found, key=lambda p: p.rank)


def _ticks_now() -> float:
    """Clock ticks since boot, now (the unit of a process's start time)."""
    try:
        uptime = float((PROC / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return uptime * os.sysconf("SC_CLK_TCK")


def _as_rank(pid: int, started: int) -> RankProcess | None:
    env = environ_of(pid)
    if "RANK" not in env:
        return None
    try:
        return RankProcess(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            pid=pid,
            start_time=started,
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
        )
    except ValueError:
        return None
