"""Ports for the servers tests start: each pytest-xdist worker draws from its own range, below the
kernel's ephemeral range, so no other worker (and no `bind(port 0)` anywhere) can take a port between
the moment it is chosen and the moment its server binds it, or while a server is down for an outage."""

from __future__ import annotations

import itertools
import os
import socket

# Two suites on one host (two checkouts) set FTPLANE_TEST_FIRST_PORT apart by workers x 500.
FIRST_PORT = int(os.environ.get("FTPLANE_TEST_FIRST_PORT", "20000"))
PORTS_PER_WORKER = 500  # 25 workers fit below 32768, where Linux's ephemeral range starts

_draws = itertools.count()


def worker_index() -> int:
    """This pytest-xdist worker's number (gw3 -> 3); 0 when the tests run in one process."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name.removeprefix("gw") or 0)


def free_port() -> int:
    """A port of this worker's range that nothing listens on now."""
    first = FIRST_PORT + worker_index() * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_draws) % PORTS_PER_WORKER
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {first}..{first + PORTS_PER_WORKER - 1}")
