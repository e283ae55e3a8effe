"""Each benchmark script end to end with tiny parameters, so the scripts cannot rot (not a measurement)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import PG_URL, REDIS_URL, require

pytestmark = pytest.mark.slow


def test_ingest_smoke(tmp_path: Path) -> None:
    from bench import ingest

    out = tmp_path / "ingest.json"
    argv = ["--duration", "1", "--warmup", "0.2", "--modes", "single,batch", "--batch", "64", "--workers", "1"]
    argv += ["--fillfactor", "50", "--database-url", require(PG_URL, "FTPLANE_TEST_DATABASE_URL"), "--json", str(out)]
    assert ingest.main(argv) == 0
    figures = json.loads(out.read_text())
    assert [f["mode"] for f in figures] == ["single", "batch", "batch"]
    assert all(f["requests"] > 0 and f["errors"] == 0 for f in figures)


def test_detect_smoke(tmp_path: Path) -> None:
    from bench import detect

    out = tmp_path / "detect.json"
    argv = ["--trials", "2", "--timeout", "2", "--supervise-interval", "0.5", "--embedded", "--json", str(out)]
    assert detect.main(argv) == 0
    trials = json.loads(out.read_text())
    assert len(trials) == 2 and all(2 <= t["detect_s"] <= t["webhook_s"] < 10 for t in trials)


def test_scale_smoke(tmp_path: Path) -> None:
    from bench import scale

    out = tmp_path / "scale.json"
    argv = ["--nodes", "32", "--rack-nodes", "16", "--sim-hours", "0.4", "--mix", "crash=1,transient=1"]
    argv += ["--mttf-1024-h", "0.15", "--seed", "1", "--json", str(out)]
    argv += ["--database-url", require(PG_URL, "FTPLANE_TEST_DATABASE_URL")]
    argv += ["--redis-url", require(REDIS_URL, "FTPLANE_TEST_REDIS_URL")]
    assert scale.main(argv) == 0  # 0: no event lost
    f = json.loads(out.read_text())
    assert f["job"]["status"] == "SUCCEEDED" and f["events_lost"] == 0 and f["faults"]
    assert abs(f["goodput"]["ettr"] - f["goodput"]["truth_ettr"]) < 0.02
