"""The local backend's logs: the node agents' kept files, read where they lie.

The local backend runs each node of an attempt under `<runs dir>/<job>/a<attempt>/n<i>/`
(workers/backends/local.py): `launch.json` names the node, `agent/` is its agent's directory, whose
`logs/` holds each rank's kept lines (ftplane/contract.py: `rank<R>.jsonl` and its older half
`rank<R>.jsonl.1`), and `exit_code` appears when the agent has ended. A page reads the files it
needs, a tail from their ends; following reads what each file gains, from where the page stopped,
across rotations, until every node read has ended.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import os
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from api.services.logs.lines import LogLine, LogQuery, LogStream, LogTarget, page
from ftplane import contract

POLL_S = 0.2
BLOCK = 64 * 1024


@dataclass(frozen=True)
class NodeDir:
    name: str
    path: Path

    @property
    def logs(self) -> Path:
        return self.path / "agent" / contract.LOG_DIR

    @property
    def ended(self) -> bool:
        return (self.path / "exit_code").exists()


def node_dirs(runs_dir: Path, job_id: str, attempt: int) -> list[NodeDir]:
    found = []
    for path in sorted((runs_dir / job_id / f"a{attempt}").glob("n*")):
        try:
            name = str(json.loads((path / "launch.json").read_text())["node"])
        except (OSError, ValueError, KeyError, TypeError):
            name = path.name
        found.append(NodeDir(name, path))
    return found


@dataclass
class RankFile:
    """One rank's kept lines on one node: where a read stopped, to follow on from there."""

    node: NodeDir
    rank: int
    attempt: int
    fd: int = -1
    offset: int = 0
    partial: bytes = b""

    @property
    def path(self) -> Path:
        return self.node.logs / contract.rank_log_name(self.rank)

    @property
    def rotated(self) -> Path:
        return self.path.with_name(self.path.name + contract.ROTATED_SUFFIX)

    def parse(self, raw: bytes) -> LogLine | None:
        record = contract.read_log_record(raw.decode(errors="replace"))
        if record is None:
            return None
        try:
            ts = datetime.fromisoformat(record["ts"])
        except ValueError:
            return None
        return LogLine(ts, record["rank"], record["seq"], self.node.name, self.attempt, record["cycle"], record["line"])

    def open(self) -> None:
        """Hold the current file from its present end: a page reads up to here, following goes on from here."""
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            self.fd, self.offset = -1, 0
            return
        self.offset = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _halves(self) -> list[tuple[int, int, bool]]:
        """(fd, bytes to read, whether the caller closes it) of the older half, then of the held one; the older
        half is skipped when it is the held file itself (rotated since it was held)."""
        halves = []
        try:
            older = os.open(self.rotated, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            older = -1
        if older >= 0 and (self.fd < 0 or os.fstat(older).st_ino != os.fstat(self.fd).st_ino):
            halves.append((older, os.fstat(older).st_size, True))
        elif older >= 0:
            os.close(older)
        if self.fd >= 0:
            halves.append((self.fd, self.offset, False))
        return halves

    def forwards(self) -> Iterator[LogLine]:
        """Every line up to where `open` held it, oldest first."""
        return self._lines(newest_first=False)

    def backwards(self) -> Iterator[LogLine]:
        """The same lines, newest first, read from the end."""
        return self._lines(newest_first=True)

    def _lines(self, *, newest_first: bool) -> Iterator[LogLine]:
        halves = self._halves()
        try:
            for fd, size, _ in reversed(halves) if newest_first else halves:
                for raw in _backwards(fd, size) if newest_first else _forwards(fd, size):
                    if (line := self.parse(raw)) is not None:
                        yield line
        finally:
            for fd, _, owned in halves:
                if owned:
                    os.close(fd)

    def new_lines(self) -> list[LogLine]:
        """What the file gained since the last read (the older half's rest first, when it was rotated meanwhile)."""
        if self.fd < 0:
            self.open()
            self.offset = 0
            if self.fd < 0:
                return []
        found: list[LogLine] = []
        while True:
            chunk = os.pread(self.fd, BLOCK, self.offset)
            if chunk:
                self.offset += len(chunk)
                *complete, self.partial = (self.partial + chunk).split(b"\n")
                found += [line for raw in complete if (line := self.parse(raw)) is not None]
                continue
            try:
                rotated = os.stat(self.path).st_ino != os.fstat(self.fd).st_ino
            except FileNotFoundError:
                rotated = False
            if not rotated:
                return found
            self._next_half()

    def _next_half(self) -> None:
        """The held half is read out and no longer the current file: go on with the half written after it. That
        is the older half now when the file rotated twice meanwhile (the held one is gone), else the current."""
        held = os.fstat(self.fd).st_ino
        self.close()
        self.offset, self.partial = 0, b""
        try:
            older = os.open(self.rotated, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            older = -1
        if older >= 0 and os.fstat(older).st_ino != held:
            self.fd = older  # written after the held half: read it all
            return
        if older >= 0:
            os.close(older)
        self.open()
        self.offset = 0


def _forwards(fd: int, size: int) -> Iterator[bytes]:
    """The lines of the first `size` bytes of a file, a block at a time."""
    position, rest = 0, b""
    while position < size:
        chunk = os.pread(fd, min(BLOCK, size - position), position)
        if not chunk:
            break
        position += len(chunk)
        *complete, rest = (rest + chunk).split(b"\n")
        yield from (line for line in complete if line)
    if rest:
        yield rest


def _backwards(fd: int, size: int) -> Iterator[bytes]:
    """The lines of the first `size` bytes of a file, last first."""
    position, rest = size, b""
    while position > 0:
        step = min(BLOCK, position)
        position -= step
        parts = (os.pread(fd, step, position) + rest).split(b"\n")
        rest = parts[0]
        yield from (part for part in reversed(parts[1:]) if part)
    if rest:
        yield rest


@dataclass
class NodeFiles:
    """The kept files of one attempt's nodes on this machine."""

    runs_dir: Path
    target: LogTarget
    query: LogQuery
    nodes: list[NodeDir] = field(default_factory=list)
    files: list[RankFile] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = node_dirs(self.runs_dir, self.target.job_id, self.query.attempt)

    def selected_nodes(self) -> list[NodeDir]:
        return [n for n in self.nodes if self.query.node is None or n.name == self.query.node]

    def _discover(self) -> list[RankFile]:
        known = {(f.node.name, f.rank) for f in self.files}
        new = []
        for node in self.selected_nodes():
            if not node.logs.is_dir():
                continue
            for entry in sorted(node.logs.iterdir()):
                rank = contract.rank_of_log_name(entry.name)
                if rank is None or (self.query.rank is not None and rank != self.query.rank):
                    continue
                if (node.name, rank) not in known:
                    known.add((node.name, rank))
                    new.append(RankFile(node, rank, self.query.attempt))
        self.files += new
        return new

    def read(self) -> LogStream | None:
        """The page, or None where this machine has none of the attempt's nodes (gone, or never here)."""
        if not self.nodes:
            return None
        for rank_file in self._discover():
            rank_file.open()
        query = self.query
        if query.tail is not None or query.follow:
            wanted = min(query.tail if query.tail is not None else query.limit, query.limit)
            newest: list[LogLine] = []
            for rank_file in self.files:
                found: list[LogLine] = []
                for line in rank_file.backwards():
                    if len(found) >= wanted or (query.since is not None and line.ts < query.since):
                        break  # a rank's lines are in time order: none further back is wanted
                    if query.wants(line):
                        found.append(line)
                newest += found
            lines, cursor = sorted(newest, key=lambda x: x.key)[-wanted:] if wanted else [], None
        else:
            ordered = heapq.merge(*(f.forwards() for f in self.files), key=lambda x: x.key)
            chosen = []
            for line in ordered:
                if query.wants(line):
                    chosen.append(line)
                    if len(chosen) > query.limit:
                        break
            lines, cursor = page(chosen, query)
        stream = LogStream("node-files", lines, cursor, nodes=[n.name for n in self.nodes])
        if query.follow:
            stream.follow = self.follow
        else:
            self.close()
        return stream

    async def follow(self) -> AsyncGenerator[list[LogLine], None]:
        """New lines as the files gain them, until every node read has ended and its files are read out."""
        try:
            while True:
                ended = all(node.ended for node in self.selected_nodes())
                for rank_file in self._discover():
                    rank_file.offset = 0
                batch = [line for f in self.files for line in f.new_lines() if self.query.wants(line)]
                yield sorted(batch, key=lambda x: x.key)
                if ended and not batch:
                    return
                await asyncio.sleep(POLL_S)
        finally:
            self.close()

    def close(self) -> None:
        for rank_file in self.files:
            rank_file.close()
