"""The contract (ftplane/contract.py) is what both sides use: the API's event types are its, a report the
node agent's buffer builds is a valid NodeReport, every variable a backend sets is named by the contract and
read by the node side under that name, and the backends read the node agent's exit codes from it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.schemas import events as event_schemas
from api.schemas.causes import CauseClass
from api.schemas.reports import NodeReport
from api.schemas.spec import JobSpec
from ftplane import contract
from ftplane.contract import EventType
from ftplane.trainer.agent import protocol
from ftplane.trainer.agent.config import AgentConfig
from ftplane.trainer.agent.gpu import DeviceHealth
from ftplane.trainer.agent.report_buffer import ReportBuffer, fill_event
from ftplane.trainer.config import parse_config
from tests.reliability.conftest import bare_app
from tests.workers.backends.kubernetes.k8s_support import make_request as make_k8s_request
from tests.workers.backends.kubernetes.k8s_support import make_spec as make_k8s_spec
from workers.backends import local
from workers.backends.base import LaunchRequest, trainer_environment
from workers.backends.kubernetes import failures as pod_failures
from workers.backends.kubernetes import manifests, policy


def test_the_apis_event_types_are_the_contracts() -> None:
    assert event_schemas.EventType is EventType
    published = bare_app().openapi()["components"]["schemas"]["EventType"]["enum"]
    assert sorted(published) == sorted(t.value for t in EventType)


def test_the_api_and_the_node_side_agree_on_the_limits() -> None:
    assert event_schemas.MAX_EVENTS_PER_BATCH == contract.MAX_EVENTS_PER_REPORT
    assert event_schemas.MAX_HEARTBEATS_PER_BATCH == contract.MAX_HEARTBEATS_PER_REPORT
    assert NodeReport.model_fields["events"].metadata[-1].max_length == contract.MAX_EVENTS_PER_REPORT
    assert NodeReport.model_fields["heartbeats"].metadata[-1].max_length == contract.MAX_HEARTBEATS_PER_REPORT


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=40)
ranks = st.integers(0, contract.MAX_RANK)
steps = st.integers(0, contract.MAX_STEP)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
details = st.dictionaries(st.text(min_size=1, max_size=12), json_scalars, max_size=8)


@st.composite
def node_events(draw: st.DrawFn, node: str, attempt: int) -> dict[str, Any]:
    """An event as the node agent makes one, or as a rank's SDK makes one and the node agent fills in."""
    event = contract.new_event(
        draw(st.sampled_from(list(EventType))),
        attempt=draw(st.none() | st.just(attempt)),
        rank=draw(st.none() | ranks),
        step=draw(st.none() | steps),
        details=draw(details),
        key=draw(
            st.none()
            | st.text(
                alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                min_size=1,
                max_size=contract.MAX_KEY_LENGTH,
            )
        ),
        node=draw(st.none() | st.just(node)),
    )
    fill_event(event, node, attempt)
    return event


unit = st.floats(0, 1)
seconds = st.floats(0, 86400)
heartbeats = st.builds(
    protocol.Heartbeat,
    rank=ranks,
    step=steps,
    throughput=st.none() | st.floats(0, 1e15),
    loss=st.none() | st.floats(-1e12, 1e12),
    step_time_s=st.none() | seconds,
    compute_s=st.none() | seconds,
    perf_score=st.none() | unit,
    total_steps=st.none() | st.integers(1, contract.MAX_STEP),
)
devices = st.builds(
    DeviceHealth,
    index=st.integers(0, contract.MAX_GPUS_PER_NODE),
    xid_errors=st.lists(st.integers(0, 2**31), max_size=4),
    ecc_uncorrected=st.integers(0, 2**40),
    throttled=st.lists(st.sampled_from(["hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"]), max_size=4),
)


@st.composite
def liveness(draw: st.DrawFn) -> dict[str, Any]:
    """The node's liveness in the shape NodeAgent._status gives it."""
    code = draw(st.none() | st.integers(-255, 255))
    ranks_seen = []
    for rank in draw(st.lists(st.integers(0, 4096), unique=True, max_size=8)):
        row: dict[str, Any] = {"rank": rank, "local_rank": rank % 8, "pid": draw(st.integers(1, 2**22))}
        row["alive"] = draw(st.booleans())
        if not row["alive"] and draw(st.booleans()):
            row["exit_code"] = draw(st.integers(-64, 255))
        ranks_seen.append(row)
    status: dict[str, Any] = {
        "pid": draw(st.integers(1, 2**22)),
        "launcher": {"pid": draw(st.integers(1, 2**22)), "alive": code is None, "exit_code": code},
        "ranks": ranks_seen,
        "progress": draw(st.sampled_from(["sdk", "log", "none"])),
        "interval_s": draw(st.floats(0.05, 3600)),
        "healthy": True,
    }
    reason = draw(st.none() | st.text(min_size=1, max_size=200))
    if reason is not None:
        status["healthy"] = False
        status["unhealthy_reason"] = reason
    gpus = draw(st.lists(devices, max_size=4))
    if gpus:
        status["gpus"] = [d.as_dict() for d in gpus]
    return status


@st.composite
def buffered_reports(draw: st.DrawFn) -> tuple[dict[str, Any], int, int]:
    node, attempt = draw(names), draw(st.integers(0, 10_000))
    buffer = ReportBuffer()
    events = draw(st.lists(node_events(node, attempt), max_size=20))
    for event in events:
        buffer.add_event(event)
    beats = draw(st.lists(heartbeats, max_size=20))
    for beat in beats:
        buffer.add_heartbeat(beat.for_control_plane(node))
    status = draw(st.none() | liveness())
    if status is not None:
        buffer.set_liveness(status)
    return buffer.take(now=0.0).body(attempt, node), len(events), len({b.rank for b in beats})


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(buffered_reports())
def test_a_report_the_node_agents_buffer_builds_is_a_node_report(built: tuple[dict[str, Any], int, int]) -> None:
    body, events, ranks_beating = built
    report = NodeReport.model_validate(body)
    assert len(report.events) == events
    assert len(report.heartbeats) == ranks_beating
    assert [e.key for e in report.events] == [e["key"] for e in body["events"]]


def test_the_local_backend_sets_the_variables_the_node_agent_reads(tmp_path: Path) -> None:
    spec = JobSpec.model_validate({"name": "contract", "command": ["true"], "nodes": 2})
    request = LaunchRequest(
        job_id="j-contract", attempt=3, spec=spec, control_plane_url="http://cp:8000", token="ftp_secret"
    )
    backend = local.LocalBackend(tmp_path)
    node = backend.nodes(request.job_id, request.attempt, spec)[1]
    env = backend.node_environment(request, node)
    config = AgentConfig.from_environment(["true"], env)
    assert (config.url, config.job_id, config.attempt, config.token) == (
        "http://cp:8000",
        "j-contract",
        3,
        "ftp_secret",
    )
    assert config.node == node.name
    assert config.run_dir == node.agent_dir
    assert config.interval_s == spec.report_interval_s


CONTRACT_NAMES = {value for name, value in vars(contract.Env).items() if name.isupper()}


def test_every_variable_a_backend_sets_is_named_by_the_contract(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {
            "name": "contract",
            "command": ["true"],
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
            "resiliency": {"inprocess": {"enabled": True}, "heartbeat_timeout_s": 120},
            "progress": {"log_pattern": r"step (?P<step>\d+)"},
            "faults": [{"kind": "exception", "rank": 0, "at_step": 3}],
            "env": {"USER_VAR": "x"},
        }
    )
    request = LaunchRequest(job_id="j", attempt=0, spec=spec, control_plane_url="http://cp:8000", token="t")
    backend = local.LocalBackend(tmp_path)
    local_env = backend.node_environment(request, backend.nodes("j", 0, spec)[0])
    pods = make_k8s_spec(resiliency={"spare_nodes": 1})
    k8s_env = {
        e["name"]
        for e in manifests.job_manifest(make_k8s_request(pods))["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    for set_by_a_backend in (set(local_env), k8s_env):
        assert {name for name in set_by_a_backend if name.startswith("FTPLANE_")} <= CONTRACT_NAMES


def test_the_built_in_trainer_reads_what_the_backends_set(tmp_path: Path) -> None:
    spec = JobSpec.model_validate(
        {
            "name": "contract",
            "command": ["true"],
            "checkpoint": {"dir": str(tmp_path / "ckpt"), "engine": "async", "interval_steps": 7, "keep": 3},
            "resiliency": {
                "inprocess": {"enabled": True, "soft_timeout_s": 20, "hard_timeout_s": 30, "max_iterations": 4},
                "heartbeat_timeout_s": 120,
            },
        }
    )
    request = LaunchRequest(job_id="j", attempt=0, spec=spec, control_plane_url="http://cp:8000", token="t")
    config = parse_config([], trainer_environment(request))
    assert (config.checkpoint_dir, config.checkpoint_engine) == (str(tmp_path / "ckpt" / "j"), "async")
    assert (config.checkpoint_interval, config.checkpoint_keep) == (7, 3)
    assert config.inprocess is True
    assert (config.inprocess_soft_timeout_s, config.inprocess_hard_timeout_s) == (20.0, 30.0)
    assert config.inprocess_max_iterations == 4


def test_the_spec_names_the_contracts_presets_and_the_agent_reads_them(tmp_path: Path) -> None:
    from typing import get_args

    from api.schemas.spec import ProgressPreset

    assert get_args(ProgressPreset) == contract.PROGRESS_PRESETS
    spec = JobSpec.model_validate(
        {"name": "preset", "command": ["true"], "progress": {"preset": "lightning"}, "env": {"PYTHONPATH": "/x"}}
    )
    request = LaunchRequest(job_id="j", attempt=0, spec=spec, control_plane_url="http://cp:8000", token="t")
    backend = local.LocalBackend(tmp_path)
    env = backend.node_environment(request, backend.nodes("j", 0, spec)[0])
    assert AgentConfig.from_environment(["true"], env).preset == "lightning"
    # The spec's env is the ranks': the agent is not given it, only passes it on.
    assert "PYTHONPATH" not in env and json.loads(env[contract.Env.RANK_ENV]) == {"PYTHONPATH": "/x"}


# What a surviving rank's gloo collective raises when its peer is killed (captured on this CPU build of torch), and
# what NCCL and its watchdog say after a peer's exit.
PEER_GONE = [
    "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:901: Connection "
    "reset by peer. This is typically caused by a remote worker hanging or bugs in the application.",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv "
    "operation to complete; Connection closed by peer [10.0.0.2]:45123",
    "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there "
    "was a network error, NCCL version 2.21.5",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) ran for 600000 ms",
]
OWN_FAILURES = ["InjectedFault: injected exception at step 20", "ValueError: loss is NaN", "killed by SIGKILL"]


def test_a_failure_whose_collective_broke_because_a_peer_died_is_a_consequence() -> None:
    assert all(contract.collective_broken(text) for text in PEER_GONE)
    assert not any(contract.collective_broken(text) for text in OWN_FAILURES)
    # (rank, its cause, the signal that ended it): rank 0's broken collective is reported before rank 1's kill.
    failures = [(0, PEER_GONE[0], None), (1, "killed by SIGKILL", "SIGKILL")]
    signal, broke = (lambda f: f[2]), (lambda f: contract.collective_broken(f[1]))
    assert contract.root_cause(failures, hung=lambda f: False, signal=signal)[0] == 1
    exceptions = [(0, PEER_GONE[0], None), (1, OWN_FAILURES[1], None)]  # no signal: the one that is no consequence
    assert contract.root_cause(exceptions, hung=lambda f: False, signal=signal, consequence=broke)[0] == 1
    assert contract.root_cause(exceptions, hung=lambda f: False, signal=signal)[0] == 0  # the old rule: first
    only = [(0, PEER_GONE[0], None)]
    assert contract.root_cause(only, hung=lambda f: False, signal=signal, consequence=broke)[0] == 0


def test_a_rank_stopped_by_the_groups_teardown_is_not_the_root_cause() -> None:
    """The launcher stops the ranks still running with SIGTERM once one failed: the one that raised is the cause."""
    torn_down = [(0, "killed by SIGTERM", "SIGTERM"), (1, "ValueError: loss is NaN", None)]
    assert contract.root_cause(torn_down, hung=lambda f: False, signal=lambda f: f[2])[0] == 1
    assert contract.fault_signal("SIGKILL") and contract.fault_signal("SIGSEGV")
    assert not any(contract.fault_signal(name) for name in (None, "SIGTERM", "SIGINT"))


def test_the_backends_read_the_contracts_exit_codes() -> None:
    assert (policy.VERDICT, policy.NODE_UNHEALTHY) == (contract.VERDICT, contract.NODE_UNHEALTHY) == (93, 94)
    assert (pod_failures.VERDICT, pod_failures.NODE_UNHEALTHY) == (contract.VERDICT, contract.NODE_UNHEALTHY)
    node = local.LocalNode(Path("/nonexistent"), "node-0")
    causes = {code: local.node_outcome(node, code)[1] for code in (contract.VERDICT, contract.NODE_UNHEALTHY)}
    assert {code: cause.cause_class for code, cause in causes.items() if cause is not None} == {
        contract.VERDICT: CauseClass.verdict,
        contract.NODE_UNHEALTHY: CauseClass.node,
    }
