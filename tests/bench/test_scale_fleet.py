"""The scale benchmark's simulated nodes (bench/scale/fleet.py, shards.py) against the real API on a port, in the
benchmark's own process or dealt over two simulator processes: every event handed to a node is stored once with
its ts, node beats are delivered, and an event queued on a node cut off the network and then frozen dies with it
(counted so, never stored)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.scale.counts import keys_carried
from bench.scale.fleet import Fleet, iso, wait_quiet
from bench.scale.loop import run_loop
from bench.scale.params import Params
from bench.scale.truth import parse
from tests.support.live_api import serve_in_thread


async def drive(p: Params, url: str, job: dict[str, Any]) -> Fleet:
    fleet = Fleet(p, url, job["id"], job["token"], p.simulator_processes)
    await fleet.start(0)
    assert len(fleet.processes()) == p.simulator_processes + (p.simulator_processes > 1)
    fleet.measure(True)
    ts = iso(time.time())
    for rank in range(p.ranks):
        running = {"key": f"run:{rank}", "type": "running", "ts": ts, "rank": rank, "step": 0, "details": {}}
        fleet.send(p.node_of(rank), running)
    restart = {"key": "restart:1", "type": "injob_restart", "ts": ts, "rank": None, "details": {"restart_count": 1}}
    fleet.send_from_every_node(restart)
    fleet.stepped(1, time.time(), 0.1)
    assert await wait_quiet(fleet, 30), "the events were not all accepted in 30 s"

    fleet.partition(3, True)  # cut off: what it queues now cannot leave ...
    fleet.send(3, {"key": "lost-with-node-3", "type": "checkpoint_saved", "ts": iso(time.time()), "rank": 6})
    await fleet.freeze(3)  # ... and dies with it
    fleet.measure(False)
    assert await fleet.close(10.0) == 0
    await fleet.collect()
    return fleet


@pytest.mark.parametrize("processes", [1, 2])
def test_every_event_handed_to_a_node_is_stored_once_in_one_process_or_two(
    app: Any, admin: TestClient, make_job: Any, processes: int
) -> None:
    job = make_job()
    p = Params(nodes=4, gpus_per_node=2, report_interval_s=0.2, simulator_processes=processes)
    with serve_in_thread(app) as url:
        fleet = run_loop(drive(p, url, job))

    ledger, tally = fleet.ledger, fleet.tally
    assert ledger.died == {"lost-with-node-3"} and not ledger.refused
    assert ledger.accepted == set(ledger.offered) - ledger.died
    events = admin.get(f"/v1/jobs/{job['id']}/events", params={"limit": 100}).json()["items"]
    stored = {key: e for e in events for key in keys_carried(e)}
    assert set(stored) == ledger.accepted  # the restart said by four nodes is one event
    running = [e for e in events if e["type"] == "running"]  # a node's two ranks' `running` is one event
    assert sorted(e["details"]["ranks"] for e in running) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(abs(parse(stored[key]["ts"]) - parse(ts)) < 1e-3 for key, ts in ledger.offered.items() if key in stored)
    assert tally.ticks > 0 and tally.delivered > 0 and tally.accepted > 0
    assert not fleet.shards  # the simulator processes ended


def test_gpus_per_node_sets_each_simulated_nodes_ranks() -> None:
    """Past the most nodes a job may have (16,384), a run doubles its ranks by `--gpus-per-node`."""
    from bench.scale.__main__ import params, parse_args

    p = params(parse_args(["--nodes", "16384", "--gpus-per-node", "16"]))
    assert (p.nodes, p.gpus_per_node, p.ranks) == (16384, 16, 262_144)
    assert p.node_of(262_143) == 16_383 and params(parse_args([])).gpus_per_node == 8
