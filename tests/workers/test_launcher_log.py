"""Reading the launcher's log: rounds of failures and their root cause."""

from __future__ import annotations

from workers.backends.local import parse_launcher_log, root_cause

LOG = """\
[INFO] [ft_launcher1@vm] gpu_ib_map: None
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 101) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group UNHEALTHY. 3/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0 (pid: 202) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group FAILED. 2/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: 1) local_rank: 0 (pid: 303) of binary: python
[ERROR] [ft_launcher1@vm] Some rank(s) exited with non-zero exit code: {0: ProcessFailure(local_rank=0, pid=303, \
exitcode=1, error_file='<N/A>'), 1: ProcessFailure(local_rank=1, pid=304, exitcode=-9, error_file='<N/A>')}.
"""


def test_failures_are_grouped_by_round_and_signals_are_the_root_cause() -> None:
    rounds = parse_launcher_log(LOG)
    assert [[f.pid for f in r] for r in rounds] == [[101], [202], [303, 304]]
    assert root_cause(rounds[0]) == "rank 1 killed by SIGKILL"
    assert root_cause(rounds[1]) == "rank 0 exit code 1"
    assert root_cause(rounds[2]) == "rank 1 killed by SIGKILL"  # rank 0's exit 1 was collateral


def test_a_clean_log_has_one_empty_round() -> None:
    assert parse_launcher_log("all good\n") == [[]]
    assert root_cause([]) is None
