"""bench/k8s_status.py keeps working: a tiny run (8 pods, one pass per case) against its fake API process."""

from __future__ import annotations

from bench import k8s_status


def test_the_status_benchmark_runs_and_measures_each_case(capsys):
    out = k8s_status.main(["--pods", "8", "--passes", "1", "--node-images", "2", "--pod-padding", "10"])
    assert set(out["results"]) == {"steady", "a page of nodes", "a node lost"}
    for figures in out["results"].values():
        assert len(figures["cpu"]) == 1 and figures["cpu"][0] >= 0 and figures["requests"] >= 2
    assert out["results"]["steady"]["requests"] == 2  # the Job and its pods: nothing else while all is well
    assert "target: < 1 s of worker CPU per pass" in capsys.readouterr().out
