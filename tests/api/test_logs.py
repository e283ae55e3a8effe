"""`GET /v1/jobs/{id}/logs` on the local backend, over node files written as the agent writes them: lines per rank
and attempt, pages, tails, text, bad input named, the failure tails where the files are gone, and follow on a
real port (keep-alives, the end, no database connection held while it waits)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.support.live_api import serve_in_thread
from tests.support.node_logs import node_logs
from tests.support.waiting import wait_for


def ndjson(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines() if line]


@pytest.fixture
def job(make_job: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return make_job(procs_per_node=2)


def test_lines_per_rank_in_order_as_ndjson_or_text(admin: TestClient, job: dict[str, Any]) -> None:
    logs, _ = node_logs(job["id"])
    for n in range(3):
        logs.rank_line(0, f"r0 step {n}")
        logs.rank_line(1, f"r1 step {n}")
    logs.cycle = 1
    logs.rank_line(1, "r1 after the restart")
    url = f"/v1/jobs/{job['id']}/logs"
    everything = ndjson(admin.get(url))
    assert [(x["rank"], x["line"]) for x in everything[:2]] == [(0, "r0 step 0"), (1, "r1 step 0")]
    assert len(everything) == 7 and everything[-1] == {
        **everything[-1],
        "rank": 1,
        "node": "host-n0",
        "attempt": 0,
        "cycle": 1,
        "line": "r1 after the restart",
    }
    assert [x["line"] for x in ndjson(admin.get(url, params={"rank": 1, "cycle": 0}))] == [
        f"r1 step {n}" for n in range(3)
    ]
    assert ndjson(admin.get(url, params={"node": "host-n0", "tail": 2})) == everything[-2:]
    text = admin.get(url, params={"tail": 2}, headers={"Accept": "text/plain"})
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text == "[rank1] r1 step 2\n[rank1] r1 after the restart\n"
    assert admin.get(url, params={"rank": 0, "tail": 1}, headers={"Accept": "text/plain"}).text == "r0 step 2\n"
    assert admin.get(url).headers["ftplane-logs-source"] == "node-files"


def test_pages_follow_a_cursor_and_a_large_limit_is_capped_and_said(admin: TestClient, job: dict[str, Any]) -> None:
    logs, _ = node_logs(job["id"])
    for n in range(25):
        logs.rank_line(n % 2, f"line {n}")
    url = f"/v1/jobs/{job['id']}/logs"
    seen: list[str] = []
    cursor = None
    while True:
        response = admin.get(url, params={"limit": 10, **({"cursor": cursor} if cursor else {})})
        seen += [x["line"] for x in ndjson(response)]
        cursor = response.headers.get("ftplane-next-cursor")
        if cursor is None:
            break
    assert seen == [f"line {n}" for n in range(25)]
    capped = admin.get(url, params={"limit": 50_000})
    assert capped.headers["ftplane-limit-capped"] == "10000" and len(ndjson(capped)) == 25


def test_what_the_job_does_not_have_is_refused_naming_the_field(admin: TestClient, job: dict[str, Any]) -> None:
    node_logs(job["id"])[0].rank_line(0, "hello")
    url = f"/v1/jobs/{job['id']}/logs"
    for params, field in [
        ({"rank": 2}, "rank"),  # 1 node x 2 ranks
        ({"attempt": 1}, "attempt"),
        ({"node": "elsewhere"}, "node"),
        ({"tail": -1}, "tail"),
        ({"limit": 0}, "limit"),
        ({"cursor": "bm90LWEtY3Vyc29y"}, "cursor"),
        ({"cursor": "abc", "tail": 3}, "cursor"),
        ({"since": "2026-01-01T00:00:00"}, "since"),  # no time zone
        ({"since": "1.192092896e-07"}, "since"),  # a number (its exponent's '-' is no date's)
    ]:
        response = admin.get(url, params=params)
        assert response.status_code == 422, (params, response.text)
        assert [f["field"] for f in response.json()["error"]["fields"]] == [field], response.json()
    assert admin.get("/v1/jobs/nope/logs").status_code == 404


def test_the_jobs_own_trainer_token_cannot_read_its_logs(client: TestClient, job: dict[str, Any]) -> None:
    node_logs(job["id"])[0].rank_line(0, "private")
    response = client.get(f"/v1/jobs/{job['id']}/logs", headers={"Authorization": f"Bearer {job['token']}"})
    assert response.status_code == 403 and "private" not in response.text


def test_where_the_files_are_gone_the_failure_tails_answer_with_a_link(
    admin: TestClient, job: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_LOGS_URL_TEMPLATE", "https://logs.example/?q=job%3D{job}%20attempt%3D{attempt}")
    get_settings.cache_clear()
    trainer = {"Authorization": f"Bearer {job['token']}"}
    failed = {"key": "f1", "type": "rank_failed", "rank": 1, "node": "host-n0", "attempt": 0}
    failed["details"] = {"cause": "exit code 1", "tail": "step 9\nValueError: boom", "round": 0}
    assert admin.post(f"/v1/jobs/{job['id']}/events", json={"events": [failed]}, headers=trainer).status_code == 200
    response = admin.get(f"/v1/jobs/{job['id']}/logs")
    assert response.headers["ftplane-logs-source"] == "events"
    assert "gone" in response.headers["ftplane-logs-notice"]
    assert response.headers["link"] == f'<https://logs.example/?q=job%3D{job["id"]}%20attempt%3D0>; rel="external"'
    lines = ndjson(response)
    assert [(x["rank"], x["node"], x["cycle"], x["line"]) for x in lines] == [
        (1, "host-n0", 0, "step 9"),
        (1, "host-n0", 0, "ValueError: boom"),
    ]
    assert ndjson(admin.get(f"/v1/jobs/{job['id']}/logs", params={"node": "host-n0", "rank": 0})) == []


@pytest.fixture
def live(app: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_LOGS_KEEPALIVE_S", "0.3")
    get_settings.cache_clear()
    with serve_in_thread(app) as url:
        yield url


def test_follow_streams_new_lines_with_keep_alives_until_the_node_ends_and_holds_no_connection(
    admin: TestClient, job: dict[str, Any], live: str, admin_token: str
) -> None:
    from api.core.db import get_engine

    logs, node = node_logs(job["id"])
    logs.rank_line(0, "before the follow")
    received: list[tuple[float, str]] = []
    done = threading.Event()

    def follow() -> None:
        headers = {"Authorization": f"Bearer {admin_token}"}
        params = {"follow": "true", "rank": 0}
        with httpx.stream("GET", f"{live}/v1/jobs/{job['id']}/logs", params=params, headers=headers, timeout=30) as r:
            for line in r.iter_lines():
                received.append((time.monotonic(), line))
        done.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait_for("the page", lambda: received, 10, interval=0.05)
    pool = get_engine().pool
    if hasattr(pool, "checkedout"):
        assert pool.checkedout() == 0  # the follow waits with no database connection
    printed = time.monotonic()
    logs.rank_line(0, "printed while following")
    wait_for("the new line", lambda: any("printed while following" in line for _, line in received), 5, interval=0.02)
    arrived = next(at for at, line in received if "printed while following" in line)
    assert arrived - printed < 2.0
    wait_for("a keep-alive", lambda: any(line == "" for _, line in received), 5, interval=0.05)
    assert not done.is_set()
    logs.rank_line(1, "another rank: not followed")
    (node / "exit_code").write_text("0")  # the node's agent ended
    assert done.wait(10), "the follow did not end with the node"
    lines = [json.loads(line)["line"] for _, line in received if line]
    assert lines == ["before the follow", "printed while following"]


def test_reads_and_follows_across_the_files_rotation(
    admin: TestClient, job: dict[str, Any], live: str, admin_token: str
) -> None:
    from ftplane import contract

    logs, node = node_logs(job["id"], max_bytes=contract.LOG_MIN_BYTES)
    filler = "x" * 200
    for n in range(5000):  # ~1.3 MB through a 1 MiB bound: rotated twice, the oldest lines gone
        logs.rank_line(0, f"{n} {filler}")
    url = f"/v1/jobs/{job['id']}/logs"
    kept = [int(x["line"].split()[0]) for x in ndjson(admin.get(url, params={"limit": 10_000}))]
    assert kept[0] > 0 and kept == list(range(kept[0], 5000))  # both halves, in order, nothing between lost
    assert [x["line"].split()[0] for x in ndjson(admin.get(url, params={"tail": 2}))] == ["4998", "4999"]

    received: list[int] = []

    def follow() -> None:
        headers = {"Authorization": f"Bearer {admin_token}"}
        params = {"follow": "true", "tail": 1}
        with httpx.stream("GET", f"{live}{url}", params=params, headers=headers, timeout=30) as response:
            for line in response.iter_lines():
                if line:
                    received.append(int(json.loads(line)["line"].split()[0]))

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    wait_for("the follow's page", lambda: received == [4999], 10, interval=0.02)
    for n in range(5000, 8000):  # rotates again while followed
        logs.rank_line(0, f"{n} {filler}")
    (node / "exit_code").write_text("0")
    reader.join(timeout=20)
    assert received == list(range(4999, 8000))  # every line once, in order, across the rotation


def test_a_follow_ends_at_its_deadline_while_the_node_runs_and_said_when_it_would(
    admin: TestClient, job: dict[str, Any], live: str, admin_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FTPLANE_LOGS_FOLLOW_MAX_S bounds a follow: `Ftplane-Follow-Until` says when, and the stream then simply ends
    (no closing line: every line is a rank's), though the node is still running."""
    from datetime import UTC, datetime

    from api.core.config import get_settings

    monkeypatch.setenv("FTPLANE_LOGS_FOLLOW_MAX_S", "1.5")
    get_settings.cache_clear()
    logs, node = node_logs(job["id"])
    logs.rank_line(0, "before the follow")
    headers = {"Authorization": f"Bearer {admin_token}"}
    url = f"{live}/v1/jobs/{job['id']}/logs"
    said: dict[str, str] = {}
    received: list[str] = []
    done = threading.Event()

    def follow() -> None:
        with httpx.stream("GET", url, params={"follow": "true"}, headers=headers, timeout=30) as response:
            said.update(response.headers)
            received.extend(response.iter_lines())  # returns once the server ends the stream
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    assert done.wait(20), "the follow went on past its deadline"  # keep-alives every 0.3 s would keep it open
    ended = datetime.now(UTC)
    until = datetime.fromisoformat(said["ftplane-follow-until"])
    assert not (node / "exit_code").exists()  # the node runs on: the deadline ended the stream
    assert until.tzinfo is not None and ended >= until
    assert [json.loads(line)["line"] for line in received if line] == ["before the follow"]
    page = admin.get(f"/v1/jobs/{job['id']}/logs")
    assert "ftplane-follow-until" not in page.headers  # a page is no follow: it says no deadline
