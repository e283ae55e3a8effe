"""The local backend's rendezvous ports (workers/backends/local_ports.py): drawn from the configured range, never a
bound or recently reserved one, never the same for two launches at once."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.core.config import Settings
from tests.support.ports import free_port
from workers.backends.local_ports import RESERVED_S, reserve_port


def a_range(size: int) -> tuple[int, int]:
    """`size` ports of this test worker's own range (tests/support/ports.py): nothing else binds them meanwhile."""
    first = free_port()
    first -= first % 2
    return first, first + size - 1


def test_each_launch_gets_a_pair_no_other_launch_holds(tmp_path: Path) -> None:
    first, last = a_range(6)
    path = tmp_path / "ports.json"
    drawn = [reserve_port(first, last, path=path, now=100.0) for _ in range(3)]
    assert sorted(drawn) == [first, first + 2, first + 4]  # every pair of the range, each once
    with pytest.raises(RuntimeError, match="FTPLANE_LOCAL_PORTS"):
        reserve_port(first, last, path=path, now=100.0 + RESERVED_S - 1)
    assert reserve_port(first, last, path=path, now=100.0 + RESERVED_S) in drawn  # reservations lapse


def test_a_port_something_is_bound_to_is_never_drawn(tmp_path: Path) -> None:
    first, last = a_range(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first + 1))  # the second port of the first pair (the trainer's own store's)
        assert reserve_port(first, last, path=tmp_path / "ports.json") == first + 2


def test_launches_drawing_at_once_never_share_a_port(tmp_path: Path) -> None:
    """Twenty draws at once, each with its own open of the lock file, as separate processes have: the lock is the
    file's, so threads contend for it as processes do."""
    first, last = a_range(40)
    path = tmp_path / "ports.json"
    with ThreadPoolExecutor(8) as pool:
        drawn = list(pool.map(lambda _: reserve_port(first, last, path=path), range(20)))
    assert len(set(drawn)) == 20 and all(first <= port < last and (port - first) % 2 == 0 for port in drawn)


@pytest.mark.parametrize("value", ["abc", "29500", "30000-29500", "80-90", "29500-70000"])
def test_a_wrong_range_is_refused_naming_it(value: str) -> None:
    with pytest.raises(ValidationError, match="local_ports"):
        Settings(local_ports=value)
    assert Settings(local_ports="29500-29501").local_port_range == (29500, 29501)
