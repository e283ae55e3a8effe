"""End to end on embedded defaults: two real local jobs, team=a with an injected crash (an in-job restart) and team=b
with an injected node loss (a job restart), run by a real `ftplane serve` whose beat keeps the fleet's summaries and
judges the nodes; `ftplane goodput --by label:team` then gives each team its job's own goodput, GPU-weighted, the
lost node is listed with its fault shown and not counted (ftplane caused it), and `ftplane get objectives` gives an
objective's state."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from ftplane.client import Client
from tests.conftest import ftplane_server
from tests.e2e.test_recovery_ladder import finished, spec, step, wait
from tests.ftplane.test_cli import ftplane

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Client, dict[str, str]]]:
    workdir = tmp_path_factory.mktemp("e2e-fleet")
    with ftplane_server(workdir) as env:
        client = Client(url=env["FTPLANE_URL"], token=env["FTPLANE_TOKEN"])
        client.workdir = workdir  # type: ignore[attr-defined]
        yield client, env
        client.close()


def fleet(env: dict[str, str]) -> dict[str, Any]:
    return dict(json.loads(ftplane(env, "goodput", "--since", "1d", "--by", "label:team", "-o", "json").stdout))


def test_each_teams_fleet_figures_are_its_jobs_own_goodput(served: tuple[Client, dict[str, str]]) -> None:
    api, env = served
    # A fault `now` reaches a node with the reply to its next report: up to a report interval (1 s) after the step
    # the control plane last heard of, itself up to an interval old. Each job gets it at step 3 of its own and has
    # steps enough left for that (one second is 7 steps at 0.15 s): a crash after the last step would be no fault.
    crashy = api.submit(spec(api, "fleet-a", 30, labels={"team": "a"}))
    lossy = api.submit(spec(api, "fleet-b", 30, labels={"team": "b"}, resiliency={"max_job_restarts": 1}))
    for job, fault in ((crashy, "crash"), (lossy, "node_loss")):
        wait(f"{job['name']} training", lambda job=job: step(api, job["id"]) >= 3)
        api.inject(job["id"], {"kind": fault, "rank": 1 if fault == "crash" else 0, "now": True})
    jobs = {"a": finished(api, crashy["id"]), "b": finished(api, lossy["id"])}
    assert jobs["a"]["status"] == jobs["b"]["status"] == "SUCCEEDED", jobs
    own = {team: api.request("GET", f"/v1/jobs/{job['id']}/goodput") for team, job in jobs.items()}
    assert own["a"]["failures"] >= 1 and own["a"]["lost_s"]["restart"] > 0
    assert own["b"]["failures"] >= 1 and jobs["b"]["attempt"] == 1

    def summarized() -> dict[str, Any] | None:
        body = fleet(env)
        groups = {g["key"]: g for g in body["groups"]}
        ready = all(
            team in groups and abs(groups[team]["wall_hours"] * 3600 - own[team]["wall_s"]) < 1e-6 for team in own
        )
        return groups if ready else None

    groups = wait("the summarizer to reach both jobs' ends", summarized, timeout=60)
    for team, goodput in own.items():
        group, gpus = groups[team], 2  # a CPU job of 2 ranks weighs 2 GPU-equivalents
        assert group["jobs"] == 1 and group["faults_total"] == goodput["failures"]
        # Equal to float precision: the summaries keep Unix seconds as doubles (a few tenths of a microsecond).
        close = {"rel": 1e-6, "abs": 1e-9}
        assert group["wall_gpu_hours"] == pytest.approx(goodput["wall_s"] * gpus / 3600, **close)
        assert group["productive_gpu_hours"] == pytest.approx(goodput["productive_s"] * gpus / 3600, **close)
        lost = {k: v * gpus / 3600 for k, v in goodput["lost_s"].items()}
        assert group["lost_gpu_hours"] == pytest.approx(lost, **close)
    assert "crash" in groups["a"]["faults"], groups["a"]["faults"]
    assert "node" in groups["b"]["faults"], groups["b"]["faults"]

    lost_node = next(e["node"] for e in api.all_events(lossy["id"]) if e["type"] == "node_failed")
    node = wait("the node judged", lambda: (n := node_of(api, lost_node)) and n["faults"] and n)
    assert node["faults"] == {"injected": 1} and node["state"] == "healthy", node
    listed = ftplane(env, "get", "nodes").stdout
    assert lost_node in listed and "healthy" in listed

    table = ftplane(env, "goodput", "--since", "1d", "--by", "label:team").stdout
    assert "label:team" in table and "fleet-a" in table  # the job that lost the most is listed
    api.request("POST", "/v1/objectives", json={"name": "team-a", "selector": {"team": "a"}, "target": 0.99})
    listed = ftplane(env, "get", "objectives").stdout
    assert "team-a" in listed and "team=a" in listed and "0.99" in listed


def node_of(api: Client, name: str) -> dict[str, Any] | None:
    nodes = api.request("GET", "/v1/nodes")["nodes"]
    return next((n for n in nodes if n["name"] == name), None)
