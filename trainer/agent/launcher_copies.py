"""ft_launcher's own copies of the ranks' output, kept from filling the node's disk.

ft_launcher tees a rank's output by sending it to a file (`<log dir>/<run>/attempt_<n>/<local
rank>/stdout.log`, `stderr.log`) and reading that file back as it grows: a rank that prints a
gigabyte would leave a gigabyte there, though the agent keeps its own copy within its bound
(rank_logs.py). The agent gives back the part of each such file the launcher has already read: it
punches it out (fallocate FALLOC_FL_PUNCH_HOLE, Linux), which frees its blocks and leaves the
file's length and every open offset as they were, so the rank goes on writing where it was and
the tee goes on reading where it was. The launcher's read position in each file is its open file's
offset, from /proc/<launcher>/fdinfo; a file the launcher does not read (not teed) is left alone.
Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
BLOCK = 4096
RELEASE_AT_LEAST = 1024 * 1024  # bytes read since the last release before the next one
TEED_NAMES = ("stdout.log", "stderr.log")


def _fallocate() -> Callable[[int, int, int, int], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


class LauncherCopies:
    def __init__(self, launcher_pid: int) -> None:
        self.launcher_pid = launcher_pid
        self.released: dict[str, int] = {}  # path -> bytes given back from its start
        self._fallocate = _fallocate()

    def release(self) -> int:
        """Give back what the launcher has read of each teed file since the last call; returns the bytes freed."""
        if self._fallocate is None:
            return 0
        freed = 0
        for path, read in self._read_positions().items():
            upto = read - read % BLOCK
            if upto - self.released.get(path, 0) < RELEASE_AT_LEAST:
                continue
            done = self._punch(path, upto)
            if done is None:
                return freed
            freed += done
        return freed

    def _read_positions(self) -> dict[str, int]:
        """Each teed file the launcher has open for reading, and how far it has read it."""
        positions: dict[str, int] = {}
        fds = Path(f"/proc/{self.launcher_pid}/fd")
        with contextlib.suppress(OSError):
            for entry in os.listdir(fds):
                try:
                    target = os.readlink(fds / entry)
                    if not target.endswith(TEED_NAMES):
                        continue
                    info = dict(line.split(":", 1) for line in (fds.parent / "fdinfo" / entry).read_text().splitlines())
                except (OSError, ValueError):
                    continue  # closed meanwhile
                if int(info.get("flags", "1").strip(), 8) & os.O_ACCMODE == os.O_RDONLY:
                    positions[target] = max(positions.get(target, 0), int(info.get("pos", "0").strip()))
        return positions

    def _punch(self, path: str, upto: int) -> int | None:
        """Punch [0, upto) out of `path`; the bytes newly freed, or None where punching is not supported."""
        assert self._fallocate is not None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return 0
        try:
            if self._fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, upto) != 0:
                error = ctypes.get_errno()
                log.warning("cannot give back ft_launcher's copies of the ranks' output: %s", os.strerror(error))
                self._fallocate = None
                return None
        finally:
            os.close(fd)
        freed = upto - self.released.get(path, 0)
        self.released[path] = upto
        return freed
