"""The local backend's rendezvous ports: drawn below the kernel's ephemeral range and reserved host-wide.

A port found by binding port 0 lies in the ephemeral range, where any outgoing connection on the host may take it
in the seconds before the job's ft_launcher binds it, and the launch fails ("Address already in use"). Ports are
drawn instead from FTPLANE_LOCAL_PORTS (default 29500-29999, torchrun's neighbourhood, below Linux's ephemeral
range) and reserved under a lock in $TMPDIR/ftplane-local-ports.json, so no two launches, of any worker on this
host, draw the same port before either has bound it. A reservation lapses after RESERVED_S, by when the launcher
holds the port; a port something is bound to is never drawn.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

RESERVED_S = 120.0


def reservations_path() -> Path:
    return Path(tempfile.gettempdir()) / "ftplane-local-ports.json"


def reserve_port(first: int, last: int, *, path: Path | None = None, now: float | None = None) -> int:
    """A port of first..last, now reserved with the next one (the built-in trainer's in-process restart opens its own
    store on the rendezvous port + 1): neither bound by anything, nor reserved by a launch in the last RESERVED_S.
    Pairs are drawn in turn (a cursor kept in the file), so a port is reused only after the whole range."""
    path = path or reservations_path()
    now = time.time() if now is None else now
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        try:
            state = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            state = {}
        reserved = {int(p): t for p, t in state.get("reserved", {}).items() if now - t < RESERVED_S}
        pairs = (last - first + 1) // 2
        cursor = int(state.get("next", 0))
        for i in range(pairs):
            port = first + 2 * ((cursor + i) % pairs)
            pair = (port, port + 1)
            if any(p in reserved or not _bindable(p) for p in pair):
                continue
            reserved.update(dict.fromkeys(pair, now))
            written = path.with_name(f"{path.name}.{os.getpid()}")
            written.write_text(json.dumps({"next": (cursor + i + 1) % pairs, "reserved": reserved}))
            os.replace(written, path)
            return port
    raise RuntimeError(f"no free ports in FTPLANE_LOCAL_PORTS {first}-{last}: each is bound or reserved by a launch")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
