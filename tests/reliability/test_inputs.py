"""Input bounds: oversized and huge bodies, deep nesting, odd Unicode, absurd numbers.

Each bad input must get a clear 4xx naming the field (a JSON error body), quickly, and must store
nothing. Runs on SQLite and PostgreSQL (which cannot store NUL in text nor NaN in JSON).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.schemas.events import MAX_DETAILS_DEPTH
from tests.conftest import row_counts, tiny_spec

NUL, RTL, ZWSP, BELL = "\x00", "\u202e", "\u200b", "\x07"
EMOJI = "\U0001f680"
LONE_SURROGATE = "\\ud800"  # as JSON spells it: no Python str can be encoded with it


def body_with(raw: dict[str, Any], **spliced: str) -> bytes:
    """JSON for `raw`, then each placeholder string '@name@' replaced by raw JSON text."""
    text = json.dumps(raw)
    for name, value in spliced.items():
        text = text.replace(f'"@{name}@"', value)
    return text.encode()


class Inputs:
    """Sends bad input and checks the answer: the status, the named field, and nothing stored."""

    def __init__(self, admin: TestClient, job: dict[str, Any]) -> None:
        self.admin = admin
        self.job = job
        self.trainer = TestClient(admin.app, headers={"Authorization": f"Bearer {job['token']}"})
        self.problems: list[str] = []
        self.tried = 0

    def refused(
        self,
        what: str,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        raw: bytes | None = None,
        field: str | None,
        status: int = 422,
        as_trainer: bool = False,
    ) -> None:
        self.tried += 1
        client = self.trainer if as_trainer else self.admin
        before = row_counts()
        if raw is not None:
            response = client.request(method, path, content=raw, headers={"content-type": "application/json"})
        else:
            response = client.request(method, path, json=json_body)
        problem = None
        try:
            error = response.json()["error"]
        except (ValueError, KeyError, TypeError):
            error = None
        if response.status_code != status:
            problem = f"answered {response.status_code}: {response.text[:200]}"
        elif error is None or error.get("status") != status or not error.get("message"):
            problem = f"no JSON error body: {response.text[:200]}"
        elif field is not None:
            named = [f["field"] for f in error.get("fields") or []]
            if not any(n == field or n.startswith(field + ".") or n.startswith(field + "[") for n in named):
                problem = f"does not name {field!r} (named {named}): {error['message'][:200]}"
        if row_counts() != before:
            problem = "stored something"
        if problem:
            self.problems.append(f"{what}: {problem}")

    def check(self) -> None:
        print(f"\n{self.tried} bad inputs tried, {self.tried - len(self.problems)} refused as they should be")
        assert not self.problems, f"{len(self.problems)} of {self.tried} bad inputs mishandled:\n" + "\n".join(
            self.problems
        )


@pytest.fixture
def inputs(admin: TestClient, make_job: Callable[..., dict[str, Any]]) -> Inputs:
    return Inputs(admin, make_job(name="target"))


def events_path(inputs: Inputs) -> str:
    return f"/v1/jobs/{inputs.job['id']}/events"


def beats_path(inputs: Inputs) -> str:
    return f"/v1/jobs/{inputs.job['id']}/heartbeats"


def event(**fields: Any) -> dict[str, Any]:
    return {"key": "k1", "type": "checkpoint_saved", **fields}


def test_oversized_bodies_are_413(inputs: Inputs) -> None:
    from api.core.config import get_settings

    limit = get_settings().max_body_bytes
    padding = "x" * (limit + 1024)
    big = json.dumps({"events": [event(details={"pad": padding})]}).encode()
    inputs.refused("body over the limit", "POST", events_path(inputs), raw=big, field=None, status=413)

    def chunks() -> Any:  # no Content-Length: the limit holds on the streamed body too
        for start in range(0, len(big), 1 << 20):
            yield big[start : start + (1 << 20)]

    before = row_counts()
    response = inputs.trainer.post(events_path(inputs), content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["status"] == 413
    assert row_counts() == before
    inputs.check()


def test_huge_batches_are_422(inputs: Inputs) -> None:
    many_events = {"events": [event(key=f"k{i}") for i in range(1001)]}
    inputs.refused("1001 events in one batch", "POST", events_path(inputs), json_body=many_events, field="events")
    many_beats = {"heartbeats": [{"rank": i, "step": 1} for i in range(20001)]}
    inputs.refused(
        "20001 heartbeats in one batch", "POST", beats_path(inputs), json_body=many_beats, field="heartbeats"
    )
    inputs.refused("an empty batch", "POST", events_path(inputs), json_body={"events": []}, field="events")
    too_many_keys = event(details={f"k{i}": i for i in range(65)})
    inputs.refused("65 detail keys", "POST", events_path(inputs), json_body={"events": [too_many_keys]}, field="events")
    fat = event(details={"blob": "x" * 70_000})
    inputs.refused("70 kB of details", "POST", events_path(inputs), json_body={"events": [fat]}, field="events")
    inputs.check()


def test_deep_nesting_is_a_quick_4xx(inputs: Inputs) -> None:
    for depth in (10_000, 100_000):
        nested = "[" * depth + "]" * depth
        raw = body_with({"events": [event(details={"deep": "@x@"})]}, x=nested)
        inputs.refused(f"details nested {depth} deep", "POST", events_path(inputs), raw=raw, field=None, status=400)
        raw = ('{"name": ' + "[" * depth + "]" * depth + "}").encode()
        inputs.refused(f"a body nested {depth} deep", "POST", "/v1/jobs", raw=raw, field=None, status=400)
    for depth in (MAX_DETAILS_DEPTH + 1, 500):  # readable, but deeper than details may be
        nested: Any = {}
        for _ in range(depth - 1):
            nested = {"n": nested}
        body = {"events": [event(details=nested)]}
        inputs.refused(f"details {depth} levels deep", "POST", events_path(inputs), json_body=body, field="events")
    inputs.check()
    response = inputs.admin.get(events_path(inputs))
    assert response.status_code == 200 and response.json()["items"] == []
    body = {"events": [event(details={"n": {"n": {"n": {"n": {}}}}})]}
    assert inputs.trainer.post(events_path(inputs), json=body).status_code == 200  # ordinary nesting is fine


def test_odd_unicode_is_refused_naming_the_field(inputs: Inputs) -> None:
    odd = {"NUL": NUL, "right-to-left override": RTL, "zero-width space": ZWSP, "emoji": EMOJI, "bell": BELL}
    for name, char in odd.items():
        spec = tiny_spec(name=f"ab{char}c")
        inputs.refused(f"job name with {name}", "POST", "/v1/jobs", json_body=spec, field="name")
        spec = tiny_spec(labels={"team": f"a{char}b"})
        inputs.refused(f"label value with {name}", "POST", "/v1/jobs", json_body=spec, field="labels")
        spec = tiny_spec(labels={f"te{char}am": "a"})
        inputs.refused(f"label key with {name}", "POST", "/v1/jobs", json_body=spec, field="labels")
        spec = tiny_spec(env={f"A{char}": "1"})
        inputs.refused(f"env name with {name}", "POST", "/v1/jobs", json_body=spec, field="env")
        if char != EMOJI:  # an emoji is a fine character in free text
            body = {"name": f"ci{char}bot"}
            inputs.refused(f"token name with {name}", "POST", "/v1/tokens", json_body=body, field="name")
    # Lone surrogates: valid JSON escapes, not characters; nowhere storable.
    spec = body_with(tiny_spec(name="@s@"), s=f'"a{LONE_SURROGATE}"')
    inputs.refused("job name with a lone surrogate", "POST", "/v1/jobs", raw=spec, field="name")
    spec = body_with(tiny_spec(command=["python", "@s@"]), s=f'"{LONE_SURROGATE}"')
    inputs.refused("command with a lone surrogate", "POST", "/v1/jobs", raw=spec, field="command[1]")
    spec = body_with(tiny_spec(labels={"team": "@s@"}), s=f'"{LONE_SURROGATE}"')
    inputs.refused("label with a lone surrogate", "POST", "/v1/jobs", raw=spec, field="labels")
    token = body_with({"name": "@s@"}, s=f'"x{LONE_SURROGATE}"')
    inputs.refused("token name with a lone surrogate", "POST", "/v1/tokens", raw=token, field="name")
    raw = body_with({"events": [event(details={"why": "@s@"})]}, s=f'"{LONE_SURROGATE}"')
    inputs.refused("details with a lone surrogate", "POST", events_path(inputs), raw=raw, field="events[0].details.why")
    raw = body_with({"events": [event(details={"@k@": 1})]}, k=f'"{LONE_SURROGATE}"')
    inputs.refused("a details key that is a lone surrogate", "POST", events_path(inputs), raw=raw, field="events")
    # NUL where free text is allowed: PostgreSQL cannot store it.
    for what, path, body, field in [
        ("NUL in a command", "/v1/jobs", tiny_spec(command=["python", f"-c{NUL}"]), "command[1]"),
        ("NUL in an env value", "/v1/jobs", tiny_spec(env={"A": f"x{NUL}"}), "env.A"),
        ("NUL in an event's node", events_path(inputs), {"events": [event(node=f"n{NUL}")]}, "events[0].node"),
        ("NUL in details", events_path(inputs), {"events": [event(details={"c": NUL})]}, "events[0].details.c"),
        ("NUL in a details key", events_path(inputs), {"events": [event(details={NUL: 1})]}, "events[0].details"),
        ("NUL in a heartbeat's node", beats_path(inputs), {"heartbeats": [{"rank": 0, "step": 1, "node": NUL}]}, None),
        ("NUL in a webhook URL", "/v1/webhooks", {"url": f"http://example.com/{NUL}"}, "url"),
    ]:
        inputs.refused(what, "POST", path, json_body=body, field=field or "heartbeats[0].node")
    for path in ("/v1/jobs/%00", "/v1/jobs/a%00/events", "/v1/webhooks/%00", "/v1/tokens/%00"):
        method = "DELETE" if "tokens" in path else "GET"
        inputs.refused(f"NUL in the path {path!r}", method, path, field=None, status=404)
    inputs.check()
    # Free text keeps what is fine: an emoji in a token name is stored and read back as sent.
    created = inputs.admin.post("/v1/tokens", json={"name": f"deploy {EMOJI}"})
    assert created.status_code == 201
    assert f"deploy {EMOJI}" in [t["name"] for t in inputs.admin.get("/v1/tokens").json()]


def test_negative_and_absurd_numbers_are_refused_naming_the_field(inputs: Inputs) -> None:
    def spec(**overrides: Any) -> dict[str, Any]:
        return tiny_spec(**overrides)

    bad_specs: list[tuple[str, dict[str, Any], str]] = [
        ("nodes -1", spec(nodes=-1), "nodes"),
        ("nodes 0", spec(nodes=0), "nodes"),
        ("nodes 10**30", spec(nodes=10**30), "nodes"),
        ("nodes 1.5", spec(nodes=1.5), "nodes"),
        ("procs_per_node 65", spec(procs_per_node=65), "procs_per_node"),
        ("procs_per_node -8", spec(procs_per_node=-8), "procs_per_node"),
        ("gpus_per_node -1", spec(resources={"gpus_per_node": -1}), "resources.gpus_per_node"),
        ("memory -1Gi", spec(resources={"memory": "-1Gi"}), "resources.memory"),
        ("interval_steps 0", spec(checkpoint={"interval_steps": 0}), "checkpoint.interval_steps"),
        ("keep -1", spec(checkpoint={"keep": -1}), "checkpoint.keep"),
        ("heartbeat_timeout_s -5", spec(resiliency={"heartbeat_timeout_s": -5}), "resiliency.heartbeat_timeout_s"),
        ("heartbeat_timeout_s 0", spec(resiliency={"heartbeat_timeout_s": 0}), "resiliency.heartbeat_timeout_s"),
        (
            "heartbeat_timeout_s 1e308",
            spec(resiliency={"heartbeat_timeout_s": 1e308}),
            "resiliency.heartbeat_timeout_s",
        ),
        ("max_in_job_restarts -1", spec(resiliency={"max_in_job_restarts": -1}), "resiliency.max_in_job_restarts"),
        ("max_job_restarts 10**6", spec(resiliency={"max_job_restarts": 10**6}), "resiliency.max_job_restarts"),
        (
            "soft_timeout_s -1",
            spec(resiliency={"inprocess": {"enabled": True, "soft_timeout_s": -1}}),
            "resiliency.inprocess.soft_timeout_s",
        ),
        ("fault rank -1", spec(faults=[{"kind": "crash", "rank": -1, "at_step": 3}]), "faults[0].rank"),
        ("fault at_step 10**13", spec(faults=[{"kind": "crash", "rank": 0, "at_step": 10**13}]), "faults[0].at_step"),
    ]
    for what, body, field in bad_specs:
        inputs.refused(f"spec {what}", "POST", "/v1/jobs", json_body=body, field=field)
    for what, value in (("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity")):
        raw = body_with(spec(resiliency={"heartbeat_timeout_s": "@v@"}), v=value)
        field = "resiliency.heartbeat_timeout_s"
        inputs.refused(f"spec heartbeat_timeout_s {what}", "POST", "/v1/jobs", raw=raw, field=field)
        raw = body_with({"events": [event(details={"loss": "@v@"})]}, v=value)
        inputs.refused(f"details {what}", "POST", events_path(inputs), raw=raw, field="events[0].details.loss")
        raw = body_with({"heartbeats": [{"rank": 0, "step": 1, "loss": "@v@"}]}, v=value)
        inputs.refused(f"heartbeat loss {what}", "POST", beats_path(inputs), raw=raw, field="heartbeats[0].loss")

    for what, beat, field in [
        ("rank -1", {"rank": -1, "step": 1}, "heartbeats[0].rank"),
        ("rank 2**40", {"rank": 2**40, "step": 1}, "heartbeats[0].rank"),
        ("step -1", {"rank": 0, "step": -1}, "heartbeats[0].step"),
        ("step 10**13", {"rank": 0, "step": 10**13}, "heartbeats[0].step"),
        ("throughput -1", {"rank": 0, "step": 1, "throughput": -1}, "heartbeats[0].throughput"),
        ("ts 1970", {"rank": 0, "step": 1, "ts": "1970-01-01T00:00:00Z"}, "heartbeats[0].ts"),
        ("ts without a zone", {"rank": 0, "step": 1, "ts": "2026-01-01T00:00:00"}, "heartbeats[0].ts"),
        ("ts as a number", {"rank": 0, "step": 1, "ts": 1767225600}, "heartbeats[0].ts"),
    ]:
        body = {"heartbeats": [beat]}
        inputs.refused(f"heartbeat {what}", "POST", beats_path(inputs), json_body=body, field=field, as_trainer=True)
    for what, fields, field in [
        ("attempt -1", {"attempt": -1}, "events[0].attempt"),
        ("rank 2**40", {"rank": 2**40}, "events[0].rank"),
        ("step -5", {"step": -5}, "events[0].step"),
        ("ts in year 3000", {"ts": "3000-01-01T00:00:00Z"}, "events[0].ts"),
        ("ts without a zone", {"ts": "2026-01-01T00:00:00"}, "events[0].ts"),
    ]:
        body = {"events": [event(**fields)]}
        inputs.refused(f"event {what}", "POST", events_path(inputs), json_body=body, field=field, as_trainer=True)
    job = inputs.job["id"]
    for what, body, field in [
        ("rank -1", {"kind": "crash", "rank": -1, "now": True}, "rank"),
        ("at_step -1", {"kind": "exception", "rank": 0, "at_step": -1}, "at_step"),
    ]:
        inputs.refused(f"fault {what}", "POST", f"/v1/jobs/{job}/faults", json_body=body, field=field)
    for what, path, field in [
        ("limit 0", "/v1/jobs?limit=0", "limit"),
        ("limit 10**9", "/v1/jobs?limit=1000000000", "limit"),
        ("limit -1", f"/v1/jobs/{job}/events?limit=-1", "limit"),
        ("cursor -1", f"/v1/jobs/{job}/events?cursor=-1", "cursor"),
        ("since without a zone", f"/v1/jobs/{job}/events?since=2026-01-01T00:00:00", "since"),
        ("since a number with an exponent", f"/v1/jobs/{job}/events?since=1.192092896e-07", "since"),
        ("audit since a number", "/v1/audit?since=1700000000", "since"),
    ]:
        inputs.refused(f"query {what}", "GET", path, field=field)
    inputs.check()
