"""NVRx 0.7's per-cycle records, read by the node agent: each record once per rewrite, the half-written and the
foreign ones skipped, and the launcher flag added only where the installed NVRx writes them."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ftplane.trainer.agent import cycle_info
from ftplane.trainer.agent.cycle_info import CycleInfoReader, CycleRecord
from tests.trainer.agent.conftest import events, submitted_job


def nvrx_record(cycle: int, *, ended: str = "", generation: int = 0, standby: str = "") -> str:
    """A record as NVRx 0.7.0's CycleInfoWriter writes it (protobuf JSON: the uint64 generation as a string)."""
    body = {
        "job_id": "",
        "attempt_index": 0,
        "cycle_number": cycle,
        "cycle_start_time": f"2026-12-03T10:0{cycle}:00.250000Z",
        "cycle_end_time": ended,
        "cycle_log_file": "",
        "active_nodes": "node-[a-b]",
        "standby_nodes": standby,
        "generation": str(generation),
        "active_ranks": "0-1",
    }
    return json.dumps(body, indent=2)


def test_each_record_is_read_once_per_rewrite(tmp_path: Path) -> None:
    reader = CycleInfoReader(tmp_path / "nvrx")
    assert reader.new() == []  # no directory yet: the launcher has not written one
    directory = tmp_path / "nvrx"
    directory.mkdir()
    (directory / "cycle_info..0.0").write_text(nvrx_record(0, standby="node-c"))
    (directory / "cycle_info..current").symlink_to("cycle_info..0.0")
    (directory / "cycle_info..0.1").write_text(nvrx_record(1)[:40])  # being written
    (first,) = reader.new()
    assert first == CycleRecord(0, 0, "2026-12-03T10:00:00.250000+00:00", "", "node-[a-b]", "node-c", "0-1", 0)
    assert first.details() == {
        "cycle": 0,
        "source": "nvrx_cycle_info",
        "started_at": "2026-12-03T10:00:00.250000+00:00",
        "active_nodes": "node-[a-b]",
        "standby_nodes": "node-c",
        "active_ranks": "0-1",
    }
    assert reader.new() == []
    (directory / "cycle_info..0.0").write_text(nvrx_record(0, ended="2026-12-03T10:01:00Z", generation=1))
    (directory / "cycle_info..0.1").write_text(nvrx_record(1))
    assert [(r.cycle, r.ended) for r in reader.new()] == [(0, "2026-12-03T10:01:00+00:00"), (1, "")]


@pytest.mark.parametrize(
    "bad",
    [
        "[]",
        '{"cycle_number": -1}',
        '{"cycle_number": true}',
        '{"cycle_number": 1, "cycle_start_time": "yesterday"}',
        '{"cycle_number": 1, "cycle_start_time": "2026-12-03T10:00:00"}',
        '{"cycle_number": 1, "active_nodes": 7}',
        '{"cycle_number": 1, "active_nodes": "' + "x" * (cycle_info.MAX_RECORD_BYTES + 1) + '"}',
    ],
)
def test_a_record_that_is_not_nvrxs_is_skipped(tmp_path: Path, bad: str) -> None:
    (tmp_path / "cycle_info..0.0").write_text(bad)
    assert CycleInfoReader(tmp_path).new() == []


def test_the_flag_is_added_only_for_an_nvrx_that_writes_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = ["ft_launcher", "--nnodes=1", "--no-python", "train.sh"]
    assert cycle_info.supported() is False  # this machine's NVRx 0.4.1 has no cycle records
    assert cycle_info.with_cycle_info(command, tmp_path) == command
    monkeypatch.setattr(cycle_info, "supported", lambda: True)
    assert cycle_info.with_cycle_info(command, tmp_path) == [
        "ft_launcher",
        f"--ft-cycle-info-dir={tmp_path}",
        "--nnodes=1",
        "--no-python",
        "train.sh",
    ]
    assert cycle_info.with_cycle_info(["python", "train.py"], tmp_path) == ["python", "train.py"]


# A stand-in launcher writes the records where the agent told NVRx 0.7 to (0.7 does not install on this Python).
RECORDING_LAUNCHER = """
import json, os, pathlib, sys
directory = pathlib.Path(os.environ["FTPLANE_AGENT_DIR"]) / "nvrx"
directory.mkdir(parents=True, exist_ok=True)
for name, body in json.loads(sys.argv[1]):
    (directory / name).write_text(body)
"""


def test_the_agent_sends_each_cycle_record_as_a_launcher_cycle(
    admin: TestClient, make_job: Any, live: str, start_agent: Any, tmp_path: Path
) -> None:
    job = submitted_job(admin, make_job)
    script = tmp_path / "recording_launcher.py"
    script.write_text(RECORDING_LAUNCHER)
    records = [
        ("cycle_info..0.0", nvrx_record(0, ended="2026-12-03T10:01:00Z", generation=1, standby="node-c")),
        ("cycle_info..0.1", nvrx_record(1)),
    ]
    assert start_agent(live, job, [sys.executable, str(script), json.dumps(records)]).wait(60) == 0
    cycles = events(admin, job["id"], "launcher_cycle")
    seen = sorted((e["details"]["cycle"], e["ts"][:19], e["details"].get("ended_at")) for e in cycles)
    assert seen == [(0, "2026-12-03T10:01:00", "2026-12-03T10:01:00+00:00"), (1, "2026-12-03T10:01:00", None)]
    assert {e["details"]["standby_nodes"] for e in cycles} == {"node-c", ""}
    goodput = admin.get(f"/v1/jobs/{job['id']}/goodput").json()
    assert goodput["launcher_phases"] == {}  # records carry no phases: the breakdown is the timed lines' alone
