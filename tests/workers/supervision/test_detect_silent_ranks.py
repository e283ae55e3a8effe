"""Silent ranks (workers/supervision/detect_silent_ranks.py): a hang and its escalation, the initial timeout
of ranks restarting after a failure or finishing after the run's last step, and a hang the launcher is already
recovering."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from tests.support.supervision import ScriptedBackend, last_seen, supervise
from tests.workers.supervision.conftest import event_types


def test_silent_rank_is_a_hang_and_a_long_one_escalates(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats",
        json={"heartbeats": [{"rank": 0, "step": 4, "ts": now.isoformat()}, {"rank": 1, "step": 4}]},
    )
    supervise(job["id"])
    assert "hang_detected" not in event_types(admin, job["id"])

    last_seen(job["id"], {1: 12}, now)
    supervise(job["id"])
    supervise(job["id"])  # the same silence is recorded once
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert len(hangs) == 1 and hangs[0]["rank"] == 1 and "no heartbeat for" in hangs[0]["details"]["cause"]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["status"] == "RECOVERING"

    last_seen(job["id"], {1: 25}, now)
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 1 and "hang not recovered in-job" in body["status_reason"]


def test_ranks_restarting_after_a_failure_get_the_initial_timeout(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    from api.core.db import session_scope
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 5, "initial_heartbeat_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 9}, {"rank": 1, "step": 9}]}
    )
    last_seen(job["id"], {0: 20, 1: 20}, now)  # silent for 4× the timeout...
    failure = {"key": "f", "type": "rank_failed", "rank": 1, "ts": (now - timedelta(seconds=18)).isoformat()}
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [failure]})  # ...because they are restarting
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 0 and "hang_detected" not in event_types(admin, job["id"])

    last_seen(job["id"], {0: 100, 1: 100}, now)
    with session_scope() as session:  # the restart began long ago and nothing has come back
        from sqlalchemy import update

        from api.database.tables import Event

        session.execute(update(Event).where(Event.key == "f").values(ts=now - timedelta(seconds=90)))
    supervise(job["id"])
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert hangs and "after a restart began" in hangs[0]["details"]["cause"]


def test_a_rank_the_launcher_restarted_for_a_hang_is_recorded_hung_but_not_escalated(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """The launcher shares the timeout: it may kill a hung rank (reported as a failure) before a pass sees the
    rank overdue. A rank already silent for the timeout when the restart began was hung."""
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 20, "initial_heartbeat_timeout_s": 120, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    now = utcnow()
    admin.post(
        f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 0, "step": 41}, {"rank": 1, "step": 41}]}
    )
    last_seen(job["id"], {0: 21.0, 1: 0.5}, now)  # rank 0 hung; rank 1 waited on it in a collective
    # 20.4 s after rank 0's last beat the launcher's timeout fired and rank 1's collective failed
    killed = {"key": "k", "type": "rank_failed", "rank": 1, "ts": (now - timedelta(seconds=0.6)).isoformat()}
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [killed]})
    supervise(job["id"])
    supervise(job["id"])  # recorded once
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert [(h["rank"], h["step"]) for h in hangs] == [(0, 41)]
    assert "when a restart began: the launcher is recovering it" in hangs[0]["details"]["cause"]
    assert hangs[0]["details"]["silent_s"] >= 21
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 0 and body["status"] != "FAILED"  # not escalated: the launcher has it


def test_ranks_past_the_last_step_get_the_initial_timeout_to_finish(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """The last checkpoint and the exit take longer than a step on a loaded node: no hang within the initial
    timeout of the last beat, a hang past it (a rank stuck on its way out), and a rank short of the last step is
    held to the heartbeat timeout."""
    from sqlalchemy import update

    from api.core.db import session_scope
    from api.database.tables import Job
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 10, "initial_heartbeat_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    now = utcnow()
    with session_scope() as session:  # as a node report whose ranks know the total sets it (ingest/group_commit.py)
        session.execute(update(Job).where(Job.id == job["id"]).values(total_steps=16))
    last = [{"rank": 0, "step": 16}, {"rank": 1, "step": 16}]
    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": last})
    assert admin.get(f"/v1/jobs/{job['id']}").json()["progress"]["total_steps"] == 16
    last_seen(job["id"], {0: 25, 1: 25}, now)  # 2.5x the timeout, finishing
    supervise(job["id"])
    assert "hang_detected" not in event_types(admin, job["id"])
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 0

    last_seen(job["id"], {0: 61, 1: 25}, now)
    supervise(job["id"])
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert [h["rank"] for h in hangs] == [0] and "after the run's last step 16" in hangs[0]["details"]["cause"]

    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": [{"rank": 1, "step": 15}]})
    last_seen(job["id"], {1: 12}, now)  # short of the last step: the heartbeat timeout
    supervise(job["id"])
    hangs = [e for e in admin.get(f"/v1/jobs/{job['id']}/events").json()["items"] if e["type"] == "hang_detected"]
    assert sorted(h["rank"] for h in hangs) == [0, 1]


def running_on_nodes(admin: TestClient, make_job: Any, nodes: int) -> tuple[dict[str, Any], datetime]:
    """A running job of `nodes` nodes of 2 ranks (rank r on node-{r // 2}), each rank heard at step 7; and now."""
    from api.schemas.events import utcnow

    job = make_job(nodes=nodes, resiliency={"heartbeat_timeout_s": 10, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    beats = [{"rank": r, "step": 7, "node": f"node-{r // 2}"} for r in range(2 * nodes)]
    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats})
    return job, utcnow()


def test_a_hang_is_one_event_per_node_naming_its_silent_ranks(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """A job-wide hang of 131,072 ranks is 16,384 events, not 131,072: a node's silent ranks are one hang, led by
    its longest-silent rank; a rank of the node found silent on a later pass adds nothing to it."""
    job, now = running_on_nodes(admin, make_job, 2)
    last_seen(job["id"], {0: 12.0, 1: 12.5, 2: 11.0, 3: 0.5}, now)
    supervise(job["id"])

    def hangs() -> list[dict[str, Any]]:
        listed = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"]
        return sorted(listed, key=lambda e: e["rank"])

    first = hangs()
    assert [(h["node"], h["rank"], h["details"].get("ranks")) for h in first] == [
        ("node-0", 1, [0, 1]),  # led by rank 1, silent the longest
        ("node-1", 2, None),  # a node's one silent rank is that rank's hang
    ]
    assert first[0]["details"]["silent_s"] >= 12.5
    assert first[0]["details"]["cause"].startswith("2 ranks of node node-0 silent, rank 1 the longest: no heartbeat")

    last_seen(job["id"], {3: 10.5}, now)  # node-1's other rank falls silent too: the same hang
    supervise(job["id"])
    assert [h["key"] for h in hangs()] == [h["key"] for h in first]


def test_the_database_judges_every_rank_as_the_deadlines_say(admin: TestClient, make_job: Any) -> None:
    """The rule is stated once (`Deadlines`); the database applies it as cut-offs on the last beat. Ranks of every
    kind on either side of their deadline, counted per node by the database, agree with the rule applied to each
    rank by hand."""
    from api.core.db import session_scope
    from api.models import liveness
    from api.models.liveness import QuietKind, Verdict
    from api.schemas.events import utcnow
    from workers.supervision.detect_silent_ranks import HUNG_BEFORE_RESTART_TOLERANCE_S, Deadlines

    timeout, initial, total = timedelta(seconds=10), timedelta(seconds=60), 16
    job = make_job(nodes=2, resiliency={"heartbeat_timeout_s": 10, "initial_heartbeat_timeout_s": 60})
    now = utcnow()
    restart_began = now - timedelta(seconds=30)
    # (rank's step, seconds quiet): running ranks either side of 10 s, finishing ones either side of 60 s, and
    # restarting ones (quiet since before the restart) hung when it began (>= 39 s) or not; 9.8 s: hung when a
    # restart began just now (quiet for the timeout less the launcher's tolerance), though not past the timeout
    quiet = [(5, 9.5), (5, 9.8), (5, 10.5), (5, 25), (16, 25), (16, 59.5), (16, 61), (5, 38), (5, 39.5), (16, 45)]
    beats = [{"rank": r, "step": step, "node": f"node-{r % 2}"} for r, (step, _) in enumerate(quiet)]
    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats})
    last_seen(job["id"], {r: s for r, (_, s) in enumerate(quiet)}, now)
    for restarting_since in (None, restart_began, now - timedelta(seconds=61), now - timedelta(seconds=0.5)):
        deadlines = Deadlines(now, timeout, initial, restarting_since)

        def verdict(step: int, seconds: float, rule: Deadlines = deadlines) -> str | None:
            beat = now - timedelta(seconds=seconds)
            since = rule.restarting_since
            kind = QuietKind.running if step < total else QuietKind.finishing
            if since is not None and since > beat:
                kind = QuietKind.restarting
            if rule.of(kind, beat) < now:
                return Verdict.silent
            hung_for = (since - beat).total_seconds() if since is not None else 0.0
            if kind == QuietKind.restarting and hung_for >= timeout.total_seconds() - HUNG_BEFORE_RESTART_TOLERANCE_S:
                return Verdict.recovering
            return None

        expected: dict[tuple[str, str], int] = {}
        for rank, (step, seconds) in enumerate(quiet):
            judged = verdict(step, seconds)
            if judged is not None:
                expected[(f"node-{rank % 2}", judged)] = expected.get((f"node-{rank % 2}", judged), 0) + 1
        with session_scope() as session:
            groups = liveness.silent_groups(session, job["id"], 0, deadlines.judgement(total))
        counted: dict[tuple[str, str], int] = {}
        for g in groups:
            assert g.node is not None
            counted[(g.node, g.verdict)] = counted.get((g.node, g.verdict), 0) + g.ranks
        assert counted == expected and expected, restarting_since


def test_a_node_silent_in_two_kinds_is_one_hang_escalated_by_its_first_deadline(
    admin: TestClient, make_job: Any, backend: ScriptedBackend
) -> None:
    """A node's rank that finished (the initial timeout) and one that did not (the heartbeat timeout) are one hang,
    led by the longer silent; the job escalates when the earlier of their deadlines is a timeout behind."""
    from sqlalchemy import update

    from api.core.db import session_scope
    from api.database.tables import Job
    from api.schemas.events import utcnow

    job = make_job(resiliency={"heartbeat_timeout_s": 10, "initial_heartbeat_timeout_s": 60, "max_job_restarts": 1})
    supervise(job["id"], force_launch=True)
    admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [{"key": "run", "type": "running"}]})
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(total_steps=16))
    beats = [{"rank": 0, "step": 16, "node": "node-0"}, {"rank": 1, "step": 15, "node": "node-0"}]
    admin.post(f"/v1/jobs/{job['id']}/heartbeats", json={"heartbeats": beats})
    now = utcnow()
    last_seen(job["id"], {0: 69, 1: 12}, now)  # 9 s past 60 s, 2 s past 10 s
    supervise(job["id"])
    hangs = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"]
    assert [(h["node"], h["rank"], h["details"]["ranks"]) for h in hangs] == [("node-0", 0, [0, 1])]
    assert "after the run's last step 16" in hangs[0]["details"]["cause"]
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 0  # 9 s overdue: less than the timeout

    last_seen(job["id"], {0: 69, 1: 21}, now)  # rank 1 is now 11 s overdue
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 1 and "hang not recovered in-job" in body["status_reason"]
    hangs = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"]
    assert len(hangs) == 1  # the same hang, not recorded again


def test_a_pass_stores_the_longest_silent_hangs_first_and_the_rest_on_the_next(
    admin: TestClient, make_job: Any, backend: ScriptedBackend, monkeypatch: Any
) -> None:
    """A job-wide hang is one hang per node; a pass stores at most `MAX_NEW_HANGS_PER_PASS` new ones, the
    longest-silent first (each led and listed as when stored at once), and the next passes the rest; the escalation
    reads every silent rank, whether its hang is stored yet or not."""
    from workers.supervision import detect_silent_ranks

    monkeypatch.setattr(detect_silent_ranks, "MAX_NEW_HANGS_PER_PASS", 2)
    job, now = running_on_nodes(admin, make_job, 5)
    # node-3 the longest silent, then node-1, node-4, node-0, node-2 (each node's ranks 0.5 s apart)
    quiet = {3: 16.0, 1: 15.0, 4: 14.0, 0: 13.0, 2: 12.0}
    last_seen(job["id"], {r: quiet[r // 2] + 0.5 * (r % 2) for r in range(10)}, now)

    def stored() -> list[tuple[str, int, list[int]]]:
        listed = admin.get(f"/v1/jobs/{job['id']}/events", params={"type": "hang_detected"}).json()["items"]
        return [(h["node"], h["rank"], h["details"]["ranks"]) for h in sorted(listed, key=lambda h: h["id"])]

    supervise(job["id"])
    assert stored() == [("node-3", 7, [6, 7]), ("node-1", 3, [2, 3])]
    supervise(job["id"])
    assert [node for node, _, _ in stored()] == ["node-3", "node-1", "node-4", "node-0"]
    supervise(job["id"])
    supervise(job["id"])  # nothing left to store
    assert [node for node, _, _ in stored()] == ["node-3", "node-1", "node-4", "node-0", "node-2"]
    assert stored()[-1] == ("node-2", 5, [4, 5])
    assert admin.get(f"/v1/jobs/{job['id']}").json()["attempt"] == 0

    # every node silent past twice the timeout before any hang of a new silence is stored: the job escalates
    monkeypatch.setattr(detect_silent_ranks, "MAX_NEW_HANGS_PER_PASS", 0)
    last_seen(job["id"], {r: 25.0 for r in range(10)}, now)
    supervise(job["id"])
    body = admin.get(f"/v1/jobs/{job['id']}").json()
    assert body["attempt"] == 1 and "hang not recovered in-job" in body["status_reason"]
