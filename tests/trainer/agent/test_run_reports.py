"""What the node agent says of each run: `running` once per round and basis, heartbeats with the run's total from
the ranks' lines, and a rank's failure that is a peer's consequence held back until the launcher reports its round."""

from __future__ import annotations

from typing import Any

import pytest

from ftplane.contract import EventType, new_event
from ftplane.trainer.agent import run_reports
from ftplane.trainer.agent.line_progress import LineProgress
from ftplane.trainer.agent.presets import PRESETS
from ftplane.trainer.agent.run_reports import RunReports


class Uplink:
    """Records what the reports send, in order."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.beats: list[dict[str, Any]] = []

    def event(self, type: EventType, **fields: Any) -> str:
        details = fields.pop("details", None)
        event = new_event(type, attempt=0, node="node-a", details=details, **fields)
        self.sent.append(event)
        return str(event["key"])

    def forward_event(self, event: dict[str, Any]) -> None:
        self.sent.append(event)

    def heartbeat(self, beat: dict[str, Any]) -> None:
        self.beats.append(beat)


def test_running_is_said_once_per_round_and_basis_with_the_start_the_output_gives() -> None:
    uplink = Uplink()
    runs = RunReports(uplink, "node-a", 0, LineProgress(PRESETS["lightning"]))
    runs.ranks_up(0, "2026-12-05T10:00:00+00:00")
    runs.ranks_up(0, "2026-12-05T10:00:01+00:00")  # seen again in the next pass: said once
    runs.rank_line(0, 0, "[ftplane] global_step=30 total=45")  # the run resumed from step 30
    runs.rank_line(0, 1, "[ftplane] global_step=30 total=45")
    runs.rank_line(0, 0, "[ftplane] global_step=37 total=45")
    said = [(e["details"]["basis"], e["details"]["start_step"], e["ts"]) for e in uplink.sent]
    assert said[0] == ("processes", None, "2026-12-05T10:00:00+00:00") and said[1][:2] == ("progress", 30)
    assert len(said) == 2
    assert [(b["rank"], b["step"], b["total_steps"]) for b in uplink.beats] == [(0, 30, 45), (1, 30, 45), (0, 37, 45)]
    assert runs.step_of(0) is not None and runs.step_of(0)[0] == 37 and runs.highest_step() == 37  # type: ignore[index]
    runs.new_round()
    assert runs.highest_step() is None
    runs.ranks_up(1, "2026-12-05T10:01:00+00:00")
    runs.rank_line(1, 0, "[ftplane] global_step=30 total=45")
    assert [(e["details"]["restart_count"], e["details"]["basis"]) for e in uplink.sent[2:]] == [
        (1, "processes"),
        (1, "progress"),
    ]


def test_a_consequence_waits_for_the_launchers_word_on_its_round() -> None:
    uplink = Uplink()
    runs = RunReports(uplink, "node-a", 0, None)
    broken = new_event(EventType.rank_failed, attempt=0, rank=0, details={"cause": "x", "consequence": True})
    own = new_event(EventType.rank_failed, attempt=0, rank=1, details={"cause": "ValueError: nan"})
    runs.forward(broken)
    runs.forward(own)  # not a consequence: at once
    assert uplink.sent == [own]
    runs.release()  # not due yet
    assert uplink.sent == [own]
    uplink.event(EventType.rank_failed, rank=2, details={"cause": "killed by SIGKILL", "source": "launcher"})
    runs.release(all_held=True)  # the launcher reported the round: the consequence follows its cause
    assert [e["rank"] for e in uplink.sent] == [1, 2, 0]


def test_a_consequence_is_held_for_a_bounded_time_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher may never report the round (a network error, no peer dead): the consequence goes anyway."""
    monkeypatch.setattr(run_reports, "HOLD_S", 0.0)
    uplink = Uplink()
    runs = run_reports.RunReports(uplink, "node-a", 0, None)
    broken = new_event(EventType.rank_failed, attempt=0, rank=0, details={"cause": "x", "consequence": True})
    runs.forward(broken)
    runs.release()  # the agent's next pass: due
    assert uplink.sent == [broken]
