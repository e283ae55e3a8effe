"""`ftplane get nodes`, `describe node` and `release node` against a real `ftplane serve`, whose beat runs the
node ledger: a node lost under two jobs is quarantined, shown, and released."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ftplane_server
from tests.ftplane.test_cli import ftplane

NODE = "cli-node-7"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    with ftplane_server(tmp_path_factory.mktemp("serve-nodes")) as env:
        yield env


def api(env: dict[str, str], method: str, path: str, **kwargs: Any) -> Any:
    answer = httpx.request(
        method, env["FTPLANE_URL"] + path, headers={"Authorization": f"Bearer {env['FTPLANE_TOKEN']}"}, **kwargs
    )
    assert answer.status_code < 300, answer.text
    return answer.json()


def nodes(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    return list(json.loads(ftplane(env, "get", "nodes", "-o", "json", *args).stdout))


@pytest.fixture(scope="module")
def quarantined(served: dict[str, str]) -> str:
    """Two jobs each report the node lost; the beat's ledger quarantines it."""
    for name in ("cli-first", "cli-second"):
        spec = {"name": name, "command": ["python", "-c", "pass"], "procs_per_node": 1}
        job = api(served, "POST", "/v1/jobs", json=spec)
        lost = {"key": uuid.uuid4().hex, "type": "node_failed", "node": NODE, "attempt": 0}
        lost["details"] = {"cause": f"node {NODE} lost", "cause_class": "node"}
        api(served, "POST", f"/v1/jobs/{job['id']}/events", json={"events": [lost]})
    deadline = time.monotonic() + 90
    while not [n for n in nodes(served) if n["name"] == NODE and n["state"] == "quarantined"]:
        assert time.monotonic() < deadline, f"{NODE} was not quarantined: {nodes(served)}"
        time.sleep(0.5)
    return NODE


def test_get_nodes_lists_them_by_state(served: dict[str, str], quarantined: str) -> None:
    table = ftplane(served, "get", "nodes").stdout
    assert quarantined in table and "quarantined" in table and "lost 2" in table
    assert [n["name"] for n in nodes(served, "--state", "quarantined")] == [quarantined]
    assert quarantined not in [n["name"] for n in nodes(served, "--state", "healthy")]


def test_describe_node_says_why(served: dict[str, str], quarantined: str) -> None:
    text = ftplane(served, "describe", "node", quarantined).stdout
    assert "quarantined" in text and "2 job(s)" in text and "cli-first" in text and "cli-second" in text
    assert "lost" in text and "history:" in text


def test_names_the_api_refuses_are_told_as_it_says(served: dict[str, str]) -> None:
    bad = ftplane(served, "describe", "node", "Not_A_Node", check=False)
    assert bad.returncode == 1 and "name" in bad.stderr
    unknown = ftplane(served, "describe", "node", "no-such-node", check=False)
    assert unknown.returncode == 1 and "no node 'no-such-node'" in unknown.stderr
    assert ftplane(served, "release", "node", "no-such-node", check=False).returncode == 2  # --reason is required


def test_release_node_puts_it_back(served: dict[str, str], quarantined: str) -> None:
    out = ftplane(served, "release", "node", quarantined, "--reason", "GPU swapped").stdout
    assert "released" in out and "healthy" in out
    node = json.loads(ftplane(served, "describe", "node", quarantined, "-o", "json").stdout)
    assert node["state"] == "healthy" and node["history"][0]["reason"] == "GPU swapped"
