"""Reading the launcher's log: rounds of failures and their root cause."""

from __future__ import annotations

from api.schemas.causes import Cause, CauseClass
from workers.backends.local import parse_launcher_log, root_cause


def message(cause: Cause | None) -> str | None:
    return cause.message if cause is not None else None


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
    assert message(root_cause(rounds[0])) == "rank 1 killed by SIGKILL"
    crash = root_cause(rounds[0])
    assert crash is not None and crash.cause_class == CauseClass.crash and crash.facts["exit_code"] == -9
    assert message(root_cause(rounds[1])) == "rank 0 exit code 1"
    assert message(root_cause(rounds[2])) == "rank 1 killed by SIGKILL"  # rank 0's exit 1 was collateral


def test_a_clean_log_has_one_empty_round() -> None:
    assert parse_launcher_log("all good\n") == [[]]
    assert root_cause([]) is None


HUNG_LOG = """\
[2026-12-03 07:00:01,000] [WARNING] [RankMonServer4242@vm:1] Did not get subsequent heartbeat. Waited 8.00 seconds.
[2026-12-03 07:00:01,001] [WARNING] [RankMonServer4242@vm:1] FT timeout elapsed.
[ERROR] [ft_launcher1@vm] failed (exitcode: -15) local_rank: 0 (pid: 101) of binary: python
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 102) of binary: python
[INFO] [ft_launcher1@vm] [default] Worker group FAILED. 2/3 attempts left; will restart worker group
[ERROR] [ft_launcher1@vm] failed (exitcode: -9) local_rank: 1 (pid: 202) of binary: python
"""


def test_a_rank_killed_for_no_heartbeat_is_the_root_cause_of_its_round_only() -> None:
    rounds = parse_launcher_log(HUNG_LOG)
    assert [[f.pid for f in r] for r in rounds] == [[101, 102], [202]]
    # rank 0's SIGTERM came first in the log but was the group's teardown; rank 1 was silent
    assert message(root_cause(rounds[0])) == "rank 1 killed by SIGKILL (ft_launcher: no heartbeat for 8 s)"
    hang = root_cause(rounds[0])
    assert hang is not None and hang.cause_class == CauseClass.hang
    assert hang.facts["rank"] == 1 and hang.facts["signal"] == "SIGKILL" and hang.facts["silent_s"] == 8
    assert rounds[0][0].silent_s is None
    assert (
        message(root_cause(rounds[1])) == "rank 1 killed by SIGKILL"
    )  # the next round's kill had no timeout before it
