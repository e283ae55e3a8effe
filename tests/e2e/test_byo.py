"""End to end, bring your own script: examples/byo's plain torch.distributed script, untouched and with the SDK,
under real node agents and ft_launcher (CPU, gloo), launched and supervised by a real `ftplane serve`."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ftplane.client import Client
from tests.conftest import ftplane_server
from tests.support.paths import REPO
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BYO = REPO / "examples" / "byo"


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    workdir = tmp_path_factory.mktemp("byo")
    with ftplane_server(workdir) as env:
        client = Client(url=env["FTPLANE_URL"], token=env["FTPLANE_TOKEN"])
        client.workdir = workdir  # type: ignore[attr-defined]
        yield client
        client.close()


def spec(api: Client, name: str, script: str, steps: int, **overrides: Any) -> dict[str, Any]:
    checkpoints = str(api.workdir / "ckpt" / name)  # type: ignore[attr-defined]
    body: dict[str, Any] = {
        "name": name,
        "command": [
            "python",
            str(BYO / script),
            f"--steps={steps}",
            "--step-delay-s=0.15",
            f"--checkpoint-dir={checkpoints}",
            "--checkpoint-every=10",
        ],
        "procs_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"dir": checkpoints, "interval_steps": 10},
        "resiliency": {
            "max_in_job_restarts": 2,
            "max_job_restarts": 0,
            "initial_heartbeat_timeout_s": 120,
            "heartbeat_timeout_s": 10,
        },
    }
    body.update(overrides)
    return body


def wait(
    what: str, condition: Callable[[], Any], timeout: float = 150, *, job: tuple[Client, str] | None = None
) -> Any:
    """`wait_for`; given the job, a timeout also says where the job was: its status, events and nodes' output."""
    try:
        return wait_for(what, condition, timeout, interval=0.3)
    except AssertionError as exc:
        if job is None:
            raise
        raise AssertionError(f"{exc}\n{where_it_was(*job)}") from None


def where_it_was(api: Client, job_id: str) -> str:
    found = api.job(job_id)
    types = collections.Counter(e["type"] for e in api.all_events(job_id))
    lines = [f"job {found['status']} ({found.get('status_reason')}); events {dict(types)}"]
    runs = api.workdir / ".ftplane" / "runs" / job_id  # type: ignore[attr-defined]
    for log in sorted(runs.glob("a*/n*/output.log")):
        lines.append(f"--- {log.relative_to(runs)} (last 25 lines)")
        lines += log.read_text(errors="replace").splitlines()[-25:]
    served = api.workdir / "serve.log"  # type: ignore[attr-defined]
    troubles = [
        line for line in served.read_text(errors="replace").splitlines() if " WARNING " in line or " ERROR " in line
    ]
    lines += ["--- serve.log's last warnings and errors", *troubles[-25:]]
    return "\n".join(lines)


def events(api: Client, job_id: str, type_: str) -> list[dict[str, Any]]:
    return [e for e in api.all_events(job_id) if e["type"] == type_]


def finished(api: Client, job_id: str) -> dict[str, Any]:
    return wait(
        "the job to end",
        lambda: (j := api.job(job_id))["status"] in ("SUCCEEDED", "FAILED") and j,
        240,
        job=(api, job_id),
    )


def test_the_untouched_script_trains_with_log_steps_and_a_crash_restarts_it_in_job(api: Client) -> None:
    resiliency = {"max_in_job_restarts": 2, "max_job_restarts": 0, "initial_heartbeat_timeout_s": 120}
    resiliency["heartbeat_timeout_s"] = 20  # margin for a busy machine: ranks print a step every 0.15 s
    plain = spec(api, "byo-plain", "train_plain.py", 60, progress={"log_pattern": r"step (?P<step>\d+)"})
    job = api.submit({**plain, "resiliency": resiliency})
    reached = wait(
        "steps read from the ranks' output",
        lambda: (j := api.job(job["id"]))["progress"]["step"] and j,
        job=(api, job["id"]),
    )
    assert reached["progress"]["step"] >= 1 and reached["progress"]["hang_detection"] == "rank"
    wait("step 15", lambda: api.job(job["id"])["progress"]["step"] >= 15, job=(api, job["id"]))
    fault = api.inject(job["id"], {"kind": "crash", "rank": 1, "now": True})
    assert fault["delivery"] == "agent"
    restart = wait("the in-job restart", lambda: events(api, job["id"], "injob_restart"), job=(api, job["id"]))[0]
    details = restart["details"]
    assert details["rank"] == 1 and details["signal"] == "SIGKILL" and details["cause_class"] == "crash"
    assert details["cause"].startswith("rank 1 killed by SIGKILL")
    done = finished(api, job["id"])
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    hangs = [e["details"]["cause"] for e in events(api, job["id"], "hang_detected")]
    assert hangs == []  # no false hang, from start to finish
    assert done["attempt"] == 0  # the launcher recovered it in place


def test_the_untouched_script_without_progress_is_not_hung_while_it_lives(api: Client) -> None:
    job = api.submit(
        spec(
            api,
            "byo-zero",
            "train_plain.py",
            40,
            resiliency={"max_in_job_restarts": 1, "initial_heartbeat_timeout_s": 60, "heartbeat_timeout_s": 6},
        )
    )
    assert api.job(job["id"])["progress"]["hang_detection"] == "node"
    done = finished(api, job["id"])  # ~8 s of training: past the heartbeat timeout, with no heartbeat at all
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    hangs = [e["details"]["cause"] for e in events(api, job["id"], "hang_detected")]
    assert hangs == [] and done["attempt"] == 0
    (node,) = api.request("GET", f"/v1/jobs/{job['id']}/nodes")
    assert node["progress"] == "none" and len(node["ranks"]) == 2


def test_the_sdk_script_reports_liveness_checkpoints_a_hang_and_goodput(api: Client) -> None:
    job = api.submit(spec(api, "byo-sdk", "train_sdk.py", 50))
    wait(
        "both ranks' liveness",
        lambda: len(api.ranks(job["id"])) == 2 and min(r["step"] for r in api.ranks(job["id"])) >= 12,
    )
    detail = api.job(job["id"])
    assert detail["progress"]["total_steps"] == 50 and detail["progress"]["eta_s"] is not None
    api.inject(job["id"], {"kind": "hang", "rank": 0, "now": True})
    hang = wait("the hang detected", lambda: events(api, job["id"], "hang_detected"), 120, job=(api, job["id"]))[0]
    assert 0 in hang["details"].get("ranks", [hang["rank"]])  # the node's silent ranks: the hung one among them
    assert hang["details"]["cause_class"] == "hang" and hang["details"]["silent_s"] >= 9
    done = finished(api, job["id"])
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    saved = events(api, job["id"], "checkpoint_saved")
    assert saved and all(e["details"]["blocking_s"] >= 0 for e in saved)
    assert events(api, job["id"], "checkpoint_loaded")  # resumed after the hang
    goodput = api.request("GET", f"/v1/jobs/{job['id']}/goodput")
    assert goodput["productive_s"] > 0 and goodput["failures"] >= 1
    assert goodput["lost_s"]["fault_detection"] > 0 and goodput["lost_s"]["checkpoint_stall"] > 0


def test_a_two_node_job_survives_losing_node_1_and_says_which_node_was_lost(api: Client) -> None:
    job = api.submit(
        spec(
            api,
            "byo-two",
            "train_plain.py",
            50,
            nodes=2,
            procs_per_node=1,  # a rank per node: what is lost is the node, whatever it runs
            progress={"log_pattern": r"step (?P<step>\d+)"},
            resiliency={
                "max_in_job_restarts": 1,
                "max_job_restarts": 1,
                "initial_heartbeat_timeout_s": 120,
                "heartbeat_timeout_s": 20,  # ranks on a busy machine may print no step for 10 s: no false hang
            },
        )
    )
    nodes = wait(
        "both nodes' ranks",
        lambda: (
            (n := api.request("GET", f"/v1/jobs/{job['id']}/nodes")) and [len(x["ranks"]) for x in n] == [1, 1] and n
        ),
        job=(api, job["id"]),
    )
    lost = next(n for n in nodes if n["node"].endswith("-n1"))
    wait("step 10", lambda: (api.job(job["id"])["progress"]["step"] or 0) >= 10, job=(api, job["id"]))
    api.inject(job["id"], {"kind": "node_loss", "rank": lost["ranks"][0]["rank"], "now": True})
    restarted = wait("the job restart", lambda: events(api, job["id"], "job_restart"), 120, job=(api, job["id"]))[0]
    assert restarted["attempt"] == 1
    assert [e["node"] for e in events(api, job["id"], "node_failed")] == [lost["node"]]
    assert [e["node"] for e in events(api, job["id"], "node_excluded")] == [lost["node"]]
    done = finished(api, job["id"])
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["excluded_nodes"] == [lost["node"]]
    relaunched = [e for e in events(api, job["id"], "submitted") if e["attempt"] == 1][0]
    assert "cannot avoid" in relaunched["details"]["note"]  # the local backend says it cannot move the job
