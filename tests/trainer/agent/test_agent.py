"""The node agent for real: it starts ft_launcher (NVRx 0.4.1, CPU), reads what the launcher does, carries out
faults, and reports all of it to the API; ranks never see the job's token."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from ftplane import contract
from ftplane.trainer.agent import protocol
from tests.support.waiting import wait_for
from tests.trainer.agent.conftest import events, launcher_command, submitted_job


def nodes(admin: TestClient, job_id: str) -> list[dict[str, Any]]:
    return list(admin.get(f"/v1/jobs/{job_id}/nodes").json())


def test_a_zero_code_job_reports_node_liveness_log_steps_and_crash_causes(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    job = submitted_job(admin, make_job, progress={"log_pattern": r"step (?P<step>\d+)"})
    agent = start_agent(
        live,
        job,
        launcher_command(tmp_path, max_restarts=1),
        STEPS="60",
        FTPLANE_LOG_PATTERN=r"step (?P<step>\d+)",
    )

    def both_ranks_alive() -> list[dict[str, Any]] | None:
        found = nodes(admin, job["id"])
        alive = [r for n in found for r in n["ranks"] if r["alive"]]
        return found if len(alive) == 2 else None

    node = wait_for("the node's liveness with two live ranks", both_ranks_alive, 60, interval=0.2)[0]
    assert node["node"] == "node-a" and node["launcher_alive"] and node["progress"] == "log" and node["healthy"]
    # The pass that first sees the ranks up says `running`, with the liveness that shows them (stored apart).
    wait_for("RUNNING", lambda: admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RUNNING", 1.5, interval=0.05)
    steps = wait_for(
        "steps read from the ranks' output",
        lambda: (
            (r := admin.get(f"/v1/jobs/{job['id']}/ranks").json()) and len(r) == 2 and all(x["step"] > 2 for x in r)
        ),
        30,
        interval=0.2,
    )
    assert steps

    fault = admin.post(f"/v1/jobs/{job['id']}/faults", json={"kind": "crash", "rank": 1, "now": True}).json()
    assert fault["delivery"] == "agent"
    restart = wait_for("the in-job restart", lambda: events(admin, job["id"], "injob_restart"), 60, interval=0.2)[0]
    details = restart["details"]
    assert details["cause_class"] == "crash" and details["rank"] == 1 and details["signal"] == "SIGKILL"
    assert details["cause"].startswith("rank 1 killed by SIGKILL") and details["restart_count"] == 1
    injected = events(admin, job["id"], "fault_injected")
    assert [(e["rank"], e["details"]["delivery"]) for e in injected] == [(1, "agent")]
    failed = events(admin, job["id"], "rank_failed")
    assert failed[0]["rank"] == 1 and failed[0]["details"]["source"] == "launcher"
    assert failed[0]["step"] > 2 and failed[0]["details"]["step_at"]  # its last step read, and when
    assert details["failed_step"] >= failed[0]["step"]

    assert agent.wait(120) == 0
    runs = {(e["details"]["restart_count"], e["details"]["basis"]): e for e in events(admin, job["id"], "running")}
    assert set(runs) == {(0, "processes"), (0, "progress"), (1, "processes"), (1, "progress")}
    assert all(e["details"]["source"] == "agent" for e in runs.values())
    # A plain pattern says steps only: where a run resumed is not said, and not guessed.
    assert all(e["details"]["start_step"] is None for e in runs.values())
    final = nodes(admin, job["id"])[0]
    assert final["launcher_alive"] is False
    assert job["token"] not in agent.output()


def test_ranks_never_see_the_token_and_bad_messages_do_not_stop_the_agent(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    """A rank that sends garbage, an oversized datagram and a valid heartbeat: the agent drops the first two
    and reports the third; the rank's environment has the agent's socket and no token."""
    script = (
        "import json, os, socket\n"
        "assert 'FTPLANE_TOKEN' not in os.environ, 'the token reached a rank'\n"
        "assert os.environ['FROM_SPEC'] == 'yes' and 'FTPLANE_RANK_ENV' not in os.environ, 'the spec env is wrong'\n"
        "path = os.environ['FTPLANE_AGENT_SOCKET']\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "s.sendto(b'not json', path)\n"
        "s.sendto(b'{' + b' ' * 70000 + b'}', path)\n"
        "s.sendto(json.dumps({'type': 'heartbeat', 'rank': int(os.environ['RANK']), 'step': 'x'}).encode(), path)\n"
        "s.sendto(json.dumps({'type': 'heartbeat', 'rank': int(os.environ['RANK']), 'step': 7}).encode(), path)\n"
        "import time; time.sleep(2)\n"
    )
    job = submitted_job(admin, make_job)
    rank_env = json.dumps({"FROM_SPEC": "yes"})  # the spec's `env`: the ranks' alone
    agent = start_agent(live, job, launcher_command(tmp_path, script=script, max_restarts=0), FTPLANE_RANK_ENV=rank_env)
    agent_env = (Path("/proc") / str(agent.process.pid) / "environ").read_bytes().split(b"\0")
    assert not any(v.startswith(b"FROM_SPEC=") for v in agent_env)  # the agent runs with its own environment
    assert agent.wait(120) == 0, agent.output()
    ranks = admin.get(f"/v1/jobs/{job['id']}/ranks").json()
    assert sorted((r["rank"], r["step"]) for r in ranks) == [(0, 7), (1, 7)]
    output = agent.output()
    assert "dropped a message from a rank: not JSON" in output and "over the 65536-byte limit" in output
    assert nodes(admin, job["id"])[0]["progress"] == "sdk"


def test_a_rank_asking_to_exclude_its_node_makes_the_agent_exit_unhealthy(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    script = (
        "import json, os, socket, time\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "if os.environ['RANK'] == '1':\n"
        "    msg = {'type': 'exclude_node', 'rank': 1, 'reason': 'ECC errors on GPU 1'}\n"
        "    s.sendto(json.dumps(msg).encode(), os.environ['FTPLANE_AGENT_SOCKET'])\n"
        "time.sleep(60)\n"
    )
    job = submitted_job(admin, make_job)
    agent = start_agent(live, job, launcher_command(tmp_path, script=script, max_restarts=0))
    assert agent.wait(120) == contract.NODE_UNHEALTHY
    (unhealthy,) = events(admin, job["id"], "node_unhealthy")
    assert unhealthy["details"]["cause_class"] == "node" and "ECC errors on GPU 1" in unhealthy["details"]["cause"]
    assert nodes(admin, job["id"])[0]["healthy"] is False


def test_nvrx_finding_the_node_unhealthy_is_a_node_fault_though_the_launcher_exits_0(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    """NVRx 0.4.1's ft_launcher exits 0 after its health check found the node unhealthy: the agent reports
    `node_unhealthy` with NVRx's reason and exits with the unhealthy-node status (a job restart without the node),
    not 0 (which would read as success)."""
    script = tmp_path / "unhealthy_launcher.py"
    script.write_text(
        "print('[WARNING] [ft_launcher1@vm] GPU health check failed for node vm: GPU 3 is not healthy', flush=True)\n"
        "print('[ERROR] [ft_launcher1@vm] Agent .run() raised UnhealthyNodeException: Node vm is unhealthy', "
        "flush=True)\n"
    )
    job = submitted_job(admin, make_job)
    assert start_agent(live, job, [sys.executable, str(script)]).wait(60) == contract.NODE_UNHEALTHY
    (unhealthy,) = events(admin, job["id"], "node_unhealthy")
    assert "GPU 3 is not healthy" in unhealthy["details"]["cause"] and unhealthy["details"]["cause_class"] == "node"
    assert nodes(admin, job["id"])[0]["healthy"] is False


def test_the_launchers_verdict_passes_through(start_agent: Any, tmp_path: Path) -> None:
    """ft_launcher's exit 93 (NVRx decided not to restart) is the agent's too; without FTPLANE_URL it reports
    nothing and still supervises."""
    agent = start_agent(None, None, ["sh", "-c", "exit 93"])
    assert agent.wait(30) == contract.VERDICT


def test_nvrx_deciding_not_to_restart_is_the_verdict_whatever_the_launcher_then_exits(
    start_agent: Any, tmp_path: Path
) -> None:
    """Finding 4: NVRx 0.6+'s progress tracker stops restarting a job that makes no progress, and its launcher then
    exits 1 like any failure. The agent reads the decision from the launcher's output and exits 93, the verdict."""
    script = tmp_path / "no_progress.py"
    script.write_text(
        "print('[ERROR] [ft_launcher1@vm] [default] Progress tracker detected no progress across restarts. "
        "No more restarts will be attempted.', flush=True)\n"
        "raise SystemExit(1)\n"
    )
    assert start_agent(None, None, [sys.executable, str(script)]).wait(60) == contract.VERDICT
    plain = tmp_path / "plain_failure.py"
    plain.write_text("raise SystemExit(1)\n")
    assert start_agent(None, None, [sys.executable, str(plain)]).wait(60) == 1


def test_protocol_refuses_what_it_cannot_read() -> None:
    import pytest

    for bad, why in [
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"type": "heartbeat", "rank": -1, "step": 0}', "rank must be"),
        (b'{"type": "heartbeat", "rank": 0, "step": 1, "loss": "NaN"}', "loss must be"),
        (b'{"type": "event", "event": {"key": "", "type": "x"}}', "event.key"),
        (b'{"type": "teleport"}', "unknown message type"),
        (b"{" + b" " * protocol.MAX_MESSAGE_BYTES + b"}", "over the"),
    ]:
        with pytest.raises(protocol.BadMessage, match=why):
            protocol.parse(bad)
    beat = protocol.parse(json.dumps({"type": "heartbeat", "rank": 3, "step": 9, "total_steps": 100}).encode())
    assert beat == protocol.Heartbeat(rank=3, step=9, total_steps=100)


# ft_launcher's timed cycle events as NVRx 0.7.0 logs them (shared_utils/profiling.py), for a start and one
# in-job restart; 0.7 does not install on this Python, so a stand-in launcher prints them.
PROFILED_LAUNCHER = """
cycles = [
    (0, "rendezvous_started", "10:00:00.000"), (0, "health_check_completed", "10:00:00.400"),
    (0, "rendezvous_completed", "10:00:01.500"), (0, "worker_start_started", "10:00:01.600"),
    (0, "worker_start_completed", "10:00:02.100"),
    (1, "failure_detected", "10:05:00.000"), (1, "worker_terminated", "10:05:03.250"),
    (1, "rendezvous_started", "10:05:03.300"), (1, "health_check_completed", "10:05:03.500"),
    (1, "rendezvous_completed", "10:05:05.300"), (1, "worker_start_started", "10:05:05.300"),
    (1, "worker_start_completed", "10:05:06.000"),
]
for cycle, event, at in cycles:
    print(f"[INFO] [vm] [workload:0(0) infra:?(?)] profiling.py:93   - Cycle: {cycle} Event: {event} Node: vm_1 "
          f"Rank: 0 Time: 2026-12-03 {at} UTC", flush=True)
"""


def test_the_launchers_timed_cycles_reach_the_goodput_breakdown(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    """NVRx 0.5+ times each cycle: the agent sends each as `launcher_cycle`, and goodput splits the initialization
    and restart buckets by it (the launcher's own clock, not the control plane's)."""
    job = submitted_job(admin, make_job)
    script = tmp_path / "profiled_launcher.py"
    script.write_text(PROFILED_LAUNCHER)
    assert start_agent(live, job, [sys.executable, str(script)]).wait(60) == 0
    cycles = sorted(events(admin, job["id"], "launcher_cycle"), key=lambda e: e["details"]["cycle"])
    assert [(e["details"]["cycle"], e["node"], e["ts"][:19]) for e in cycles] == [
        (0, "node-a", "2026-12-03T10:00:00"),
        (1, "node-a", "2026-12-03T10:05:00"),
    ]
    assert cycles[0]["details"]["phases"] == {"rendezvous": 1.5, "health_check": 0.4, "worker_start": 0.5}
    assert cycles[1]["details"]["phases"] == {
        "termination": 3.25,
        "rendezvous": 2.0,
        "health_check": 0.2,
        "worker_start": 0.7,
    }
    goodput = admin.get(f"/v1/jobs/{job['id']}/goodput").json()
    assert goodput["launcher_phases"] == {
        "initialization": {"rendezvous": 1.5, "health_check": 0.4, "worker_start": 0.5},
        "restart": {"termination": 3.25, "rendezvous": 2.0, "health_check": 0.2, "worker_start": 0.7},
    }
    page = admin.get(f"/ui/jobs/{job['id']}/live").text  # the job page says it in words
    assert "Restart, as the launcher timed it: termination 3.2 s · rendezvous 2.0 s · health check 0.2 s" in page
