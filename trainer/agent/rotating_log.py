"""A log file kept on the node within a bound: what the agent writes grows a file, never the disk.

The file is written in two halves: once a write would take it past half the bound, it is renamed
NAME.1 (replacing the older half) and a new NAME begun, so the two never hold more than the bound
together and the newest lines are always kept. Whole lines only: a write is one or more lines,
each shorter than half the bound. Standard library only.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ftplane import contract


class RotatingLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        if max_bytes < contract.LOG_MIN_BYTES:
            raise ValueError(f"a log's bound must be at least {contract.LOG_MIN_BYTES} bytes, not {max_bytes}")
        self.path = path
        self.rotated = path.with_name(path.name + contract.ROTATED_SUFFIX)
        self.half = max_bytes // 2
        self._lock = threading.Lock()
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, data: bytes) -> None:
        """Append whole lines (a longer write than half the bound keeps its end)."""
        if len(data) > self.half:
            data = data[-self.half :]
        with self._lock:
            if self._fd < 0:
                return
            if self._size + len(data) > self.half:
                os.close(self._fd)
                os.replace(self.path, self.rotated)
                self._fd = self._open()
                self._size = 0
            os.write(self._fd, data)
            self._size += len(data)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
