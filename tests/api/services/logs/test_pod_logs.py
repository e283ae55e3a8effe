"""Kubernetes jobs' logs: `GET /v1/jobs/{id}/logs` reads the pods' container logs through the real `kubernetes`
client from the fake API's `pods/log` (tests/fake_kubernetes/pod_logs.py): lines per rank from the pod that hosts
it, tail, since, follow until the container ends, and a deleted pod answered from the stored failure tails."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException

from ftplane.trainer.agent.rank_logs import RankLogs
from ftplane.trainer.agent.redaction import Redactor
from tests.fake_kubernetes import FakeKube
from tests.support.live_api import serve_in_thread
from tests.support.supervision import use_backend
from tests.support.waiting import wait_for
from tests.workers.backends.kubernetes.conftest import backend_for
from tests.workers.backends.kubernetes.k8s_support import NS, start_job
from workers.backends.kubernetes import manifests as m


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, app: Any) -> Iterator[FakeKube]:
    kube = FakeKube().start()
    use_backend(monkeypatch, backend_for(kube, node_refresh_s=3600.0))
    monkeypatch.setattr("api.services.logs.pods.api_client", kube.api_client)
    yield kube
    kube.stop()


def pods_of(fake: FakeKube, job_id: str) -> list[dict[str, Any]]:
    pods = fake.list("pods", NS, m.attempt_selector(job_id, 0))
    return sorted(pods, key=lambda p: int(p["metadata"]["labels"][m.COMPLETION_INDEX_LABEL]))


def lines_of(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(x) for x in response.text.splitlines() if x]


@pytest.fixture
def job(admin: TestClient, fake: FakeKube) -> tuple[str, list[dict[str, Any]]]:
    job_id, _, _ = start_job(admin, fake, nodes=2, procs_per_node=2, resources={"gpus_per_node": 2})
    return job_id, pods_of(fake, job_id)


def log_requests(fake: FakeKube) -> list[dict[str, list[str]]]:
    return [r.query for r in fake.requests if r.path.endswith("/log")]


def test_lines_per_rank_from_its_pod_with_tail_and_since(admin: TestClient, fake: FakeKube, job: Any) -> None:
    job_id, (pod0, pod1) = job
    name0, name1 = pod0["metadata"]["name"], pod1["metadata"]["name"]
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    fake.pod_logs.write(NS, name0, "[rank0]:an hour ago", at=hour_ago)
    fake.pod_logs.write(NS, name0, "2026-01-01 00:00:00 [agent] INFO starting ft_launcher")  # not a rank's line
    for n in range(3):
        fake.pod_logs.write(NS, name0, f"[rank0]:step {n}")
        fake.pod_logs.write(NS, name0, f"[rank1]:step {n}")
        fake.pod_logs.write(NS, name1, f"[rank2]:step {n}")
    url = f"/v1/jobs/{job_id}/logs"
    everything = lines_of(admin.get(url))
    assert len(everything) == 10 and everything[0]["line"] == "an hour ago"
    assert {x["node"] for x in everything if x["rank"] == 2} == {pod1["spec"]["nodeName"]}
    assert all(x["cycle"] is None and x["attempt"] == 0 for x in everything)

    fake.requests.clear()
    tail = lines_of(admin.get(url, params={"rank": 2, "tail": 2}))
    assert [x["line"] for x in tail] == ["step 1", "step 2"]
    (asked,) = log_requests(fake)  # only the pod that hosts rank 2, its tail passed through
    assert asked["tailLines"] == ["202"] and asked["timestamps"] == ["true"] and asked["container"] == ["trainer"]

    fake.requests.clear()
    recent = lines_of(admin.get(url, params={"rank": 0, "since": (hour_ago + timedelta(minutes=1)).isoformat()}))
    assert [x["line"] for x in recent] == ["step 0", "step 1", "step 2"]
    assert int(log_requests(fake)[0]["sinceSeconds"][0]) >= 3540

    assert admin.get(url, params={"node": "not-a-node"}).json()["error"]["fields"][0]["field"] == "node"


def test_the_cycle_an_agent_echoes_with_each_line_is_read_and_filtered(
    admin: TestClient, fake: FakeKube, job: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The node agent echoes each rank's line with the launcher cycle that printed it (trainer/agent/rank_logs.py);
    a line of an agent that did not say it has no cycle."""
    job_id, (pod0, _) = job
    name0 = pod0["metadata"]["name"]
    echoed = RankLogs(tmp_path / "logs", Redactor(), echo=True)  # as the agent writes its container's log
    echoed.rank_line(0, "step 1")
    echoed.new_cycle(1)
    echoed.rank_line(1, "after the in-job restart")
    echoed.close()
    for line in capfd.readouterr().out.splitlines():
        fake.pod_logs.write(NS, name0, line)
    fake.pod_logs.write(NS, name0, "[rank0]:an older agent's line")
    url = f"/v1/jobs/{job_id}/logs"
    assert [(x["rank"], x["cycle"], x["line"]) for x in lines_of(admin.get(url))] == [
        (0, 0, "step 1"),
        (1, 1, "after the in-job restart"),
        (0, None, "an older agent's line"),
    ]
    assert [x["line"] for x in lines_of(admin.get(url, params={"cycle": 1}))] == ["after the in-job restart"]
    assert [x["line"] for x in lines_of(admin.get(url, params={"cycle": 0, "rank": 0}))] == ["step 1"]


def test_a_deleted_pod_answers_with_the_stored_failure_tail_and_a_link(
    admin: TestClient, fake: FakeKube, job: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_LOGS_URL_TEMPLATE", "https://grafana.example/explore?job={job}&attempt={attempt}")
    get_settings.cache_clear()
    job_id, pods = job
    failed = {"key": "rf", "type": "rank_failed", "rank": 3, "node": pods[1]["spec"]["nodeName"]}
    failed["details"] = {"cause": "exit code 1", "tail": "Traceback (most recent call last):\nKeyError: 'lr'"}
    assert admin.post(f"/v1/jobs/{job_id}/events", json={"events": [failed]}).status_code == 200
    fake.delete("jobs", NS, m.attempt_name(job_id, "llama-8b-fsdp", 0), "Background")  # as a job restart does
    assert pods_of(fake, job_id) == []
    response = admin.get(f"/v1/jobs/{job_id}/logs", params={"rank": 3})
    assert (
        response.headers["ftplane-logs-source"] == "events"
        and "pods are gone" in response.headers["ftplane-logs-notice"]
    )
    assert response.headers["link"] == f'<https://grafana.example/explore?job={job_id}&attempt=0>; rel="external"'
    assert [x["line"] for x in lines_of(response)] == ["Traceback (most recent call last):", "KeyError: 'lr'"]


def test_follow_streams_new_lines_until_the_container_ends(
    admin: TestClient, fake: FakeKube, job: Any, app: Any, admin_token: str
) -> None:
    job_id, (pod0, _) = job
    name0 = pod0["metadata"]["name"]
    fake.pod_logs.write(NS, name0, "[rank1]:before")
    received: list[tuple[float, str]] = []
    done = threading.Event()

    def follow(url: str) -> None:
        headers = {"Authorization": f"Bearer {admin_token}", "Accept": "text/plain"}
        params = {"rank": 1, "follow": "true"}
        with httpx.stream("GET", f"{url}/v1/jobs/{job_id}/logs", params=params, headers=headers, timeout=30) as r:
            for line in r.iter_lines():
                received.append((time.monotonic(), line))
        done.set()

    with serve_in_thread(app) as url:
        threading.Thread(target=follow, args=(url,), daemon=True).start()
        wait_for("the page", lambda: received, 10, interval=0.05)
        wait_for("the follow request", lambda: any(q.get("follow") == ["true"] for q in log_requests(fake)), 10)
        written = time.monotonic()
        fake.pod_logs.write(NS, name0, "[rank1]:while following")
        fake.pod_logs.write(NS, name0, "[rank0]:another rank")
        wait_for("the new line", lambda: any(x == "while following" for _, x in received), 5, interval=0.02)
        assert next(at for at, x in received if x == "while following") - written < 2.0
        fake.exit(m.attempt_name(job_id, "llama-8b-fsdp", 0), NS, 0, 0)
        assert done.wait(10), "the follow did not end with the container"
    assert [x for _, x in received if x] == ["before", "while following"]


def test_the_fake_api_checks_log_options_as_the_api_server_does(fake: FakeKube, job: Any) -> None:
    _, (pod0, _) = job
    core = k8s_client.CoreV1Api(fake.api_client())
    name = pod0["metadata"]["name"]
    for options, status, said in [
        ({"tail_lines": -1}, 422, "tailLines"),
        ({"since_seconds": 0}, 422, "sinceSeconds"),
        ({"limit_bytes": 0}, 422, "limitBytes"),
        ({"container": "sidecar"}, 400, "container sidecar is not valid for pod"),
    ]:
        with pytest.raises(ApiException) as refused:
            core.read_namespaced_pod_log(name, NS, **options)
        assert refused.value.status == status and said in str(refused.value.body), options
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod_log("no-such-pod", NS)
    assert gone.value.status == 404
    fake.pod_logs.write(NS, name, "one")
    fake.pod_logs.write(NS, name, "two")
    assert core.read_namespaced_pod_log(name, NS, container="trainer", tail_lines=1) == "two\n"
    stamped = core.read_namespaced_pod_log(name, NS, timestamps=True, limit_bytes=100)
    stamp, _, text = stamped.splitlines()[0].partition(" ")
    assert text == "one" and stamp.endswith("Z") and datetime.fromisoformat(stamp).tzinfo is not None


def test_a_cluster_that_cannot_be_read_answers_with_the_stored_tails_and_says_why(
    admin: TestClient, fake: FakeKube, job: Any
) -> None:
    job_id, _ = job
    failed = {"key": "rf", "type": "rank_failed", "rank": 0, "details": {"cause": "exit code 1", "tail": "boom"}}
    assert admin.post(f"/v1/jobs/{job_id}/events", json={"events": [failed]}).status_code == 200
    fake.fail("GET", r"/pods$", 500, times=1)
    response = admin.get(f"/v1/jobs/{job_id}/logs")
    assert response.headers["ftplane-logs-source"] == "events"
    assert "listing the attempt's pods failed: HTTP 500" in response.headers["ftplane-logs-notice"]
    assert [x["line"] for x in lines_of(response)] == ["boom"]
