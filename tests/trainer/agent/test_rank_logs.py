"""Each rank's output kept on the node: records the control plane can read, within the bound, redacted."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from ftplane import contract
from ftplane.trainer.agent.rank_logs import RankLogs, lines_of
from ftplane.trainer.agent.redaction import Redactor
from ftplane.trainer.agent.rotating_log import RotatingLog

MIB = 1024 * 1024


def records(directory: Path, rank: int) -> list[dict[str, object]]:
    found = []
    for name in (contract.rank_log_name(rank) + contract.ROTATED_SUFFIX, contract.rank_log_name(rank)):
        path = directory / name
        if path.exists():
            found += [r for r in map(contract.read_log_record, path.read_text().splitlines()) if r]
    return found


def test_a_rank_printing_past_the_bound_keeps_its_newest_lines_within_it(tmp_path: Path) -> None:
    logs = RankLogs(tmp_path / "logs", Redactor(), max_bytes=contract.LOG_MIN_BYTES)
    line = "x" * 200
    for n in range(20_000):  # ~4.6 MB of records through a 1 MiB bound
        logs.rank_line(0, f"{n} {line}")
    logs.close()
    files = list((tmp_path / "logs").iterdir())
    assert sorted(p.name for p in files) == ["rank0.jsonl", "rank0.jsonl.1"]
    assert sum(p.stat().st_size for p in files) <= contract.LOG_MIN_BYTES
    kept = records(tmp_path / "logs", 0)
    assert kept[-1]["seq"] == 19_999 and kept[-1]["line"] == f"19999 {line}"
    assert [r["seq"] for r in kept] == list(range(int(kept[0]["seq"]), 20_000))  # oldest lines went, none between


def test_records_name_rank_cycle_and_order_and_lines_are_redacted(tmp_path: Path) -> None:
    token = "ftp_job_" + "A" * 43
    logs = RankLogs(tmp_path / "logs", Redactor(["hunter2-secret"]))
    logs.rank_line(1, "step 1")
    logs.cycle = 1
    assert logs.rank_line(1, f"password=hunter2-secret token={token}") == "password=*** token=***"
    logs.launcher_line(f"launcher says {token}")
    logs.close()
    kept = records(tmp_path / "logs", 1)
    assert [(r["rank"], r["cycle"], r["seq"], r["line"]) for r in kept] == [
        (1, 0, 0, "step 1"),
        (1, 1, 1, "password=*** token=***"),
    ]
    assert all(str(r["ts"]).endswith("+00:00") for r in kept)
    launcher = (tmp_path / "launcher.log").read_text()
    assert "launcher says ***" in launcher and token not in launcher


def test_the_tail_is_the_last_lines_within_the_contracts_limits(tmp_path: Path) -> None:
    logs = RankLogs(tmp_path / "logs", Redactor())
    for n in range(100):
        logs.rank_line(2, f"line {n}")
    assert logs.tail(2) == [f"line {n}" for n in range(60, 100)] and logs.tail(3) == []
    wide = ["y" * 1000] * 40
    assert len(contract.tail_text(wide).encode()) <= contract.TAIL_MAX_BYTES
    assert contract.tail_text(wide).count("\n") == 7  # 8 lines of 1,001 bytes fit in 8 KiB
    assert contract.tail_text(["z" * 20_000]) == "z" * contract.TAIL_MAX_BYTES  # one long line keeps its end


def test_a_line_longer_than_the_limit_comes_in_pieces_of_the_same_rank() -> None:
    long = b"[rank3]:" + b"a" * (contract.LOG_LINE_MAX_BYTES + 10) + b"\n"
    stream = io.BytesIO(long + b"launcher line\n" + b"[rank1]:short\n")
    lines = list(lines_of(stream))
    assert [line[:8] for line in lines] == ["[rank3]:", "[rank3]:", "launcher", "[rank1]:"]
    assert sum(len(line) for line in lines[:2]) == len(long) + 8 - 1 + 1  # the prefix again, same text


def test_a_bound_below_the_minimum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least"):
        RotatingLog(tmp_path / "x.log", 1000)


def test_a_kept_line_that_is_not_a_record_is_skipped() -> None:
    assert contract.read_log_record('{"ts": "x", "rank": 0, "cycle": 0, "seq": 1, "line": "ok"}') is not None
    assert contract.read_log_record('{"ts": "x", "rank": 0, "cy') is None
    assert contract.read_log_record(json.dumps({"line": 3})) is None
    assert contract.rank_of_log_name("rank12.jsonl.1") == 12 and contract.rank_of_log_name("launcher.log") is None
