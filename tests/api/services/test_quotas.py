"""Per-project GPU limits: a job over its project's limit waits PENDING, says why in a `queued` event, and launches
once enough GPUs are free; restarts keep their place."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import tiny_spec
from tests.support.supervision import ScriptedBackend, supervise, use_backend


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch, app: Any) -> ScriptedBackend:
    scripted = ScriptedBackend()
    use_backend(monkeypatch, scripted)
    return scripted


def submit(admin: TestClient, project: str, gpus: int, name: str) -> str:
    spec = tiny_spec(name=name, project=project, nodes=2, resources={"gpus_per_node": gpus})
    answer = admin.post("/v1/jobs", json=spec)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def events(admin: TestClient, job_id: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/events", params={"limit": 1000}).json()["items"])


def test_a_job_over_the_limit_waits_pending_until_gpus_are_free(admin: TestClient, backend: ScriptedBackend) -> None:
    assert admin.post("/v1/projects", json={"name": "vision", "gpu_limit": 16}).status_code == 201
    first = submit(admin, "vision", 4, "first")  # 2 nodes x 4 GPUs
    second = submit(admin, "vision", 8, "second")  # 16: over the limit while `first` holds 8
    elsewhere = submit(admin, "default", 8, "elsewhere")  # another project: no limit
    for job_id in (first, second, elsewhere, second):
        supervise(job_id, force_launch=True)
    assert [launch.job_id for launch in backend.launches] == [first, elsewhere]
    waiting = admin.get(f"/v1/jobs/{second}").json()
    assert waiting["status"] == "PENDING" and waiting["attempts"][0]["status"] == "PENDING"
    queued = [e for e in events(admin, second) if e["type"] == "queued"]
    assert len(queued) == 1, queued  # said once, however many passes
    details = queued[0]["details"]
    assert details["queue_state"] == "waiting" and details["cause_class"] == "scheduling"
    assert (details["gpus_held"], details["gpu_limit"], details["gpus"]) == (8, 16, 16)
    assert "project 'vision' is at its GPU limit" in details["cause"]

    assert admin.post(f"/v1/jobs/{first}/cancel").status_code == 202
    supervise()  # the cancel duty ends `first`
    assert admin.get(f"/v1/jobs/{first}").json()["status"] == "CANCELLED"
    supervise(second, force_launch=True)
    assert [launch.job_id for launch in backend.launches][-1] == second
    assert admin.get(f"/v1/jobs/{second}").json()["status"] == "SUBMITTED"
    states = [e["details"].get("queue_state") for e in events(admin, second) if e["type"] == "queued"]
    assert states == ["waiting", "admitted"]


def test_raising_the_limit_admits_a_waiting_job(admin: TestClient, backend: ScriptedBackend) -> None:
    assert admin.post("/v1/projects", json={"name": "nlp", "gpu_limit": 8}).status_code == 201
    running, waiting = submit(admin, "nlp", 4, "running"), submit(admin, "nlp", 4, "waiting")
    supervise(running, force_launch=True)
    supervise(waiting, force_launch=True)
    assert [launch.job_id for launch in backend.launches] == [running]
    assert admin.patch("/v1/projects/nlp", json={"gpu_limit": 16}).json()["gpu_limit"] == 16
    supervise(waiting, force_launch=True)
    assert [launch.job_id for launch in backend.launches] == [running, waiting]


def test_a_job_bigger_than_its_projects_limit_waits_and_jobs_without_gpus_never_do(
    admin: TestClient, backend: ScriptedBackend
) -> None:
    assert admin.post("/v1/projects", json={"name": "tiny", "gpu_limit": 0}).status_code == 201
    cpu_only = admin.post("/v1/jobs", json=tiny_spec(name="cpu", project="tiny")).json()["id"]
    big = submit(admin, "tiny", 1, "big")
    supervise(cpu_only, force_launch=True)
    supervise(big, force_launch=True)
    assert [launch.job_id for launch in backend.launches] == [cpu_only]
    assert admin.get(f"/v1/jobs/{big}").json()["status"] == "PENDING"


def test_two_launches_at_once_cannot_both_take_the_last_gpus(
    admin: TestClient, backend: ScriptedBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second launch waits for the first's admission (the project's row is locked while it counts), then
    sees its GPUs held. Counting is slowed so that, without the lock, both would count before either admits."""
    import threading
    import time

    from api.services import quotas

    assert admin.post("/v1/projects", json={"name": "race", "gpu_limit": 8}).status_code == 201
    jobs = [submit(admin, "race", 4, f"racer-{n}") for n in range(2)]  # 8 GPUs each: one fits
    counting = quotas.gpus_held

    def slow_count(*args: Any, **kwargs: Any) -> int:
        held = counting(*args, **kwargs)
        time.sleep(0.5)  # the other launch arrives meanwhile
        return held

    monkeypatch.setattr(quotas, "gpus_held", slow_count)
    errors: list[BaseException] = []

    def launch(job_id: str) -> None:
        try:
            supervise(job_id, force_launch=True)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(job_id,)) for job_id in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and len(backend.launches) == 1, (errors, backend.launches)
    statuses = sorted(admin.get(f"/v1/jobs/{job_id}").json()["status"] for job_id in jobs)
    assert statuses == ["PENDING", "SUBMITTED"]
