"""bench.ingest's verdict: the report's cost against `/healthz`, and a healthz window whose API CPU the kernel did
not count (10 ms ticks: a 1 s window on a busy machine may count none), said so instead of divided by."""

from __future__ import annotations

from bench.ingest import MODES, Outcome, verdict
from bench.load import LoadResult


def outcome(mode: str, api_cores: float) -> Outcome:
    load = LoadResult(requests=100, errors=0, elapsed_s=1.0, latencies_ms=[5.0] * 100)
    return Outcome("postgresql", MODES[mode], load, {"api": api_cores})


def test_the_reports_cost_is_a_ratio_of_healthzs() -> None:
    (line,) = verdict([outcome("healthz", 0.05), outcome("report", 0.10)])
    assert "API CPU per request 2.00x healthz" in line and line.endswith(": met")


def test_a_healthz_window_with_no_cpu_counted_is_not_measured() -> None:
    (line,) = verdict([outcome("healthz", 0.0), outcome("report", 0.10)])
    assert "API CPU per request not measured" in line
