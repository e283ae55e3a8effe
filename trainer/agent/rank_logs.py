"""Each rank's output, kept on the node: every line redacted, timestamped and numbered, in a file of the
rank's own within a bound, and its last lines at hand for a failure's tail.

    <agent dir>/logs/rank3.jsonl      {"ts": ..., "rank": 3, "cycle": 1, "seq": 812, "line": "step 120 loss 2.31"}
    <agent dir>/logs/rank3.jsonl.1    the older half, once the file passed half the bound

The agent's directory is per attempt (and node); `cycle` is the launcher's round the line was
printed in (0 until the first in-job restart). The layout and the record are the contract's
(ftplane/contract.py), read by the control plane. The launcher's own lines are kept apart, in
`launcher.log` under the same bound. With `echo` (a pod: the container's log is what the cluster
keeps), every line also goes to the agent's stdout, redacted: the launcher's own as it printed them, a
rank's after `[rank<R> c<cycle>]:` (ECHO_PREFIX), so a reader of the container's log (the control plane's,
api/services/logs/pods.py) knows each line's rank and launcher cycle.
"""

from __future__ import annotations

import collections
import os
import re
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import IO

from ftplane import contract
from ftplane.contract import utcnow_iso
from ftplane.trainer.agent.redaction import Redactor
from ftplane.trainer.agent.rotating_log import RotatingLog

RANK_PREFIX = re.compile(rb"^\[rank\d+\]:")
ECHO_PREFIX = "[rank{rank} c{cycle}]:"  # a rank's line in the container's log


def lines_of(stream: IO[bytes]) -> Iterator[str]:
    """The launcher's output line by line; a line longer than contract.LOG_LINE_MAX_BYTES comes in pieces,
    each a line of the same rank."""
    continued = b""  # the rank prefix of a line that did not fit in one piece
    for raw in iter(partial(stream.readline, contract.LOG_LINE_MAX_BYTES), b""):
        piece = continued + raw if continued and not RANK_PREFIX.match(raw) else raw
        continued = b""
        if not raw.endswith(b"\n"):
            prefix = RANK_PREFIX.match(piece)
            continued = prefix[0] if prefix else b""
        yield piece.decode(errors="replace")


class RankLogs:
    def __init__(
        self, directory: Path, redact: Redactor, max_bytes: int = contract.LOG_MAX_BYTES, *, echo: bool = False
    ) -> None:
        self.directory = directory
        self.redact = redact
        self.echo = echo
        self.max_bytes = max_bytes
        self.cycle = 0  # the launcher's round new lines belong to (`new_cycle` moves it on)
        directory.mkdir(parents=True, exist_ok=True)
        self.launcher = RotatingLog(directory.parent / "launcher.log", max_bytes)
        self._files: dict[int, RotatingLog] = {}
        self._seq: dict[int, int] = {}
        self._tails: dict[int, collections.deque[str]] = {}  # this cycle's last lines, per rank
        self._ended: dict[int, list[str]] = {}  # the previous cycle's
        self._lock = threading.Lock()

    def rank_line(self, rank: int, text: str) -> str:
        """Keep one line a rank printed; returns it redacted."""
        line = self.redact(text)
        with self._lock:
            kept = self._files.get(rank)
            if kept is None:
                kept = self._files[rank] = RotatingLog(self.directory / contract.rank_log_name(rank), self.max_bytes)
                self._tails[rank] = collections.deque(maxlen=contract.TAIL_LINES)
            seq = self._seq.get(rank, 0)
            self._seq[rank] = seq + 1
            self._tails[rank].append(line)
            record_cycle = self.cycle
            record = contract.log_record(ts=utcnow_iso(), rank=rank, cycle=record_cycle, seq=seq, line=line)
        kept.write(record.encode() + b"\n")
        if self.echo:
            os.write(1, f"{ECHO_PREFIX.format(rank=rank, cycle=record_cycle)}{line}\n".encode())
        return line

    def launcher_line(self, text: str) -> str:
        """Keep one of the launcher's own lines; returns it redacted."""
        line = self.redact(text)
        self.launcher.write(f"{utcnow_iso()} {line}\n".encode())
        if self.echo:
            os.write(1, f"{line}\n".encode())
        return line

    def new_cycle(self, cycle: int) -> None:
        """The launcher restarted its ranks: what they print from now on is `cycle`'s (it says so once the old
        round's output is all out)."""
        with self._lock:
            self.cycle = cycle
            self._ended = {rank: list(lines) for rank, lines in self._tails.items()}
            for lines in self._tails.values():
                lines.clear()

    def tail(self, rank: int, cycle: int | None = None) -> list[str]:
        """The rank's last lines in `cycle` (default: this one), at most contract.TAIL_LINES, oldest first."""
        with self._lock:
            if cycle is None or cycle == self.cycle:
                return list(self._tails.get(rank, ()))
            return list(self._ended.get(rank, ())) if cycle == self.cycle - 1 else []

    def ranks(self) -> list[int]:
        """The ranks that printed a line here, in order."""
        with self._lock:
            return sorted(self._tails)

    def close(self) -> None:
        with self._lock:
            files = list(self._files.values())
        for kept in [*files, self.launcher]:
            kept.close()
