"""ft_launcher's own copies of the ranks' output (trainer/agent/launcher_copies.py), on a real file: a rank's output
grown far past the bound while a reader tees it, what was read given back, the file's blocks kept within the
bound, and every line reaching the reader whole and in order."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from ftplane.trainer.agent.launcher_copies import (
    BLOCK,
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE,
    RELEASE_AT_LEAST,
    LauncherCopies,
)

ROUNDS = 48
ROUND_BYTES = 256 * 1024  # 12 MiB in all: nine times the bound
BOUND = RELEASE_AT_LEAST + ROUND_BYTES + 16 * BLOCK  # what a release leaves, plus one round's growth, plus slack


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def can_punch(directory: Path) -> bool:
    probe = directory / "probe"
    probe.write_bytes(b"x" * 4 * BLOCK)
    fd = os.open(probe, os.O_WRONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        return libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 2 * BLOCK) == 0
    finally:
        os.close(fd)
        probe.unlink()


def test_what_the_launcher_read_is_given_back_and_no_line_is_lost(tmp_path: Path) -> None:
    if not can_punch(tmp_path):
        pytest.skip("this filesystem cannot punch holes (the agent then leaves the copies alone)")
    path = tmp_path / "run" / "attempt_0" / "0" / "stdout.log"
    path.parent.mkdir(parents=True)
    writer = open(path, "ab", buffering=0)  # noqa: SIM115 - the rank's end, closed below
    reader = open(path, "rb", buffering=0)  # noqa: SIM115 - the launcher's tee, closed below
    copies = LauncherCopies(os.getpid())  # this process plays the launcher: its read-only fd is the tee's
    written = 0
    next_line = 0
    received = bytearray()
    lines: list[bytes] = []
    freed = 0
    try:
        for _ in range(ROUNDS):
            chunk = bytearray()
            while len(chunk) < ROUND_BYTES:
                chunk += f"rank 0 line {next_line} {'x' * (next_line % 97)}\n".encode()
                next_line += 1
            writer.write(bytes(chunk))
            written += len(chunk)
            # The tee reads in odd sizes: its position ends mid-line and mid-block, where nothing may be punched.
            while data := reader.read(1000 + 7 * (len(lines) % 13)):
                received += data
                *complete, rest = bytes(received).split(b"\n")
                lines.extend(complete)
                received = bytearray(rest)
            freed += copies.release()
            assert allocated(path) <= BOUND
            assert os.stat(path).st_size == written  # the length (and every offset) as it was
    finally:
        writer.close()
        reader.close()

    assert written > 8 * BOUND  # grown far past the bound
    assert freed >= written - BOUND
    assert not received  # the last line was read whole
    assert len(lines) == next_line
    for number, line in enumerate(lines):
        assert line == f"rank 0 line {number} {'x' * (number % 97)}".encode()


def test_a_file_open_for_writing_only_is_never_punched(tmp_path: Path) -> None:
    """Not teed (the launcher does not read it): nobody has read it, so nothing of it is given back."""
    path = tmp_path / "stdout.log"
    with open(path, "ab", buffering=0) as writer:
        writer.write(b"y" * 4 * RELEASE_AT_LEAST)
        copies = LauncherCopies(os.getpid())
        assert copies.release() == 0
        assert path.read_bytes() == b"y" * 4 * RELEASE_AT_LEAST
