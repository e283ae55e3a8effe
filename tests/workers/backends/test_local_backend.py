"""The local backend: one node agent per node on this machine, each with a real ft_launcher (no control plane)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.schemas.causes import CauseClass
from api.schemas.spec import JobSpec
from ftplane import contract
from ftplane.trainer.agent.processes import descendants, environ_of, process_start_time
from tests.support.waiting import wait_for
from workers.backends.base import AttemptPhase, AttemptReading, LaunchRequest
from workers.backends.local import LocalBackend

WORKER = (
    "import os, sys, time\n"
    "deadline = time.time() + float(os.environ.get('RUN_FOR', '60'))\n"
    "while time.time() < deadline:\n"
    "    time.sleep(0.05)\n"
    "sys.exit(int(os.environ.get('EXIT_WITH', '0')))\n"
)


def spec(**overrides: object) -> JobSpec:
    base: dict[str, object] = {
        "name": "local-test",
        "command": ["python", "-c", WORKER],
        "procs_per_node": 2,
        "resiliency": {"max_in_job_restarts": 1, "heartbeat_timeout_s": 60, "initial_heartbeat_timeout_s": 60},
    }
    base.update(overrides)
    return JobSpec.model_validate(base)


def launch(backend: LocalBackend, job_spec: JobSpec, job_id: str = "job1") -> LaunchRequest:
    request = LaunchRequest(
        job_id=job_id, attempt=0, spec=job_spec, token="ftp_job_secret", control_plane_url="http://127.0.0.1:9"
    )
    backend.launch(request)
    return request


@pytest.fixture
def backend(tmp_path: Path) -> LocalBackend:
    return LocalBackend(runs_dir=tmp_path / "runs")


def ranks_of(backend: LocalBackend, job_spec: JobSpec) -> dict[int, str]:
    """Global rank -> node, read from the rank processes' environment."""
    found = {}
    for node in backend.nodes("job1", 0, job_spec):
        record = node.launched()
        if record is None:
            continue
        for pid in descendants(int(record["pid"])):  # type: ignore[call-overload]
            env = environ_of(pid)
            if "RANK" in env and env.get("FTPLANE_NODE_NAME") == node.name:
                found[int(env["RANK"])] = node.name
    return found


@pytest.mark.slow
def test_success_and_idempotent_launch(backend: LocalBackend) -> None:
    job_spec = spec(env={"RUN_FOR": "1"})
    launch(backend, job_spec)
    (node,) = backend.nodes("job1", 0, job_spec)
    first = node.launched()
    launch(backend, job_spec)  # a redelivered launch starts nothing new
    assert node.launched() == first
    status = wait_for(
        "end", lambda: (s := backend.status("job1", 0, job_spec)).phase != AttemptPhase.running and s, interval=0.2
    )
    assert isinstance(status, AttemptReading) and status.phase == AttemptPhase.succeeded
    assert node.exit_code() == 0 and "ft_launcher" in node.log_text()
    assert "ftp_job_secret" not in node.log_text()


@pytest.mark.slow
def test_the_job_runs_in_a_directory_of_its_own_with_the_specs_env_for_its_ranks_only(
    backend: LocalBackend, tmp_path: Path
) -> None:
    """By default the job's directory under the runs dir (never the server's); the spec's env reaches the ranks
    (through the agent, which runs without it); a relative checkpoint.dir is made in the working directory."""
    job_spec = spec(env={"RUN_FOR": "30", "FROM_SPEC": "yes"}, checkpoint={"dir": "ckpt"})
    launch(backend, job_spec)
    (node,) = backend.nodes("job1", 0, job_spec)
    workdir = backend.runs_dir / "job1" / "work"
    assert (workdir / "ckpt").is_dir()
    record = node.launched()
    assert record is not None
    runner = int(record["pid"])  # type: ignore[call-overload]

    def processes() -> list[int] | None:
        tree = descendants(runner)
        ranks = [pid for pid in tree if "RANK" in environ_of(pid)]
        return tree if len(ranks) == 2 else None

    tree = wait_for("the ranks", processes, 60, interval=0.2)
    agents = [pid for pid in tree if b"ftplane.trainer.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    ranks = [pid for pid in tree if "RANK" in environ_of(pid)]
    assert len(agents) == 1 and len(ranks) == 2
    assert "FROM_SPEC" not in environ_of(agents[0]) and all(environ_of(p)["FROM_SPEC"] == "yes" for p in ranks)
    assert all(Path(f"/proc/{pid}/cwd").resolve() == workdir.resolve() for pid in [*agents, *ranks])
    backend.cancel("job1", 0, job_spec)

    elsewhere = tmp_path / "mine"
    elsewhere.mkdir()
    assert backend.working_dir("job2", spec(working_dir=str(elsewhere))) == elsewhere


@pytest.mark.slow
def test_two_nodes_join_one_rendezvous_and_cancel_ends_both(backend: LocalBackend, tmp_path: Path) -> None:
    job_spec = spec(nodes=2)
    launch(backend, job_spec)
    placed = wait_for("4 ranks on 2 nodes", lambda: (r := ranks_of(backend, job_spec)) and len(r) == 4 and r, 60)
    assert sorted(placed) == [0, 1, 2, 3] and len(set(placed.values())) == 2
    tree = [p for n in backend.nodes("job1", 0, job_spec) for p in descendants(int(n.launched()["pid"]))]  # type: ignore[index,call-overload]
    readopted = LocalBackend(runs_dir=tmp_path / "runs")  # a new worker process, same state on disk
    assert readopted.status("job1", 0, job_spec).phase == AttemptPhase.running
    readopted.cancel("job1", 0, job_spec)
    wait_for("every process to end", lambda: all(process_start_time(p) is None for p in tree), timeout=30, interval=0.2)
    assert readopted.status("job1", 0, job_spec).phase == AttemptPhase.failed
    readopted.cancel("job1", 0, job_spec)  # idempotent


@pytest.mark.parametrize(
    "codes, phase, cause_class, blamed",
    [
        ((0, 0), AttemptPhase.succeeded, None, ()),
        ((0, contract.NODE_UNHEALTHY), AttemptPhase.failed, CauseClass.node, (1,)),
        ((contract.VERDICT, contract.VERDICT), AttemptPhase.failed, CauseClass.verdict, ()),
        ((1, -9), AttemptPhase.failed, CauseClass.node, (1,)),  # node 1's agent was killed: the node is lost
        ((1, 0), AttemptPhase.failed, CauseClass.crash, ()),  # node 0's launcher spent its in-job restarts
        ((0, None), AttemptPhase.failed, CauseClass.node, (1,)),  # node 1 vanished without an exit code
    ],
)
def test_how_each_node_ended_decides_the_attempt(
    backend: LocalBackend,
    codes: tuple[int | None, ...],
    phase: AttemptPhase,
    cause_class: CauseClass | None,
    blamed: tuple[int, ...],
) -> None:
    job_spec = spec(nodes=2)
    nodes = backend.nodes("job1", 0, job_spec)
    for node, code in zip(nodes, codes, strict=True):
        node.path.mkdir(parents=True)
        node.launch_file.write_text('{"pid": 0, "start_time": -1}')
        if code is not None:
            (node.path / "exit_code").write_text(str(code))
    status = backend.status("job1", 0, job_spec)
    assert status.phase == phase
    assert (status.cause.cause_class if status.cause else None) == cause_class
    assert status.failed_nodes == tuple(nodes[i].name for i in blamed)


def test_render_hides_the_token_and_shows_one_agent_per_node(backend: LocalBackend) -> None:
    request = LaunchRequest(
        job_id="j", attempt=0, spec=spec(nodes=2), token="ftp_job_secret", control_plane_url="http://x"
    )
    text = backend.render(request)
    assert "ftp_job_secret" not in text and text.count("-P -m ftplane.trainer.agent --node") == 2
    assert "ft_launcher" in text and "--max-restarts=1" in text and "--nnodes=2" in text
