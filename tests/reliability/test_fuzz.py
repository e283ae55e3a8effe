"""Fuzz the served OpenAPI with schemathesis, in process, as an admin, with every check.

Two tests:

- the whole schema as `schemathesis run` would fuzz it, on SQLite: every phase (examples, coverage,
  fuzzing, and stateful sequences that follow the OpenAPI links to real jobs, webhooks and
  deliveries) and every check (status codes, content types, headers and bodies as documented; valid
  data accepted, invalid data refused; 405 with an `Allow` header; no 5xx). The token routes are left
  out of it, so the run cannot revoke its own token;
- every operation on its own, on SQLite and on PostgreSQL (which refuses more: NUL in text, NaN in
  JSON), valid and invalid requests with every check, path ids either generated or those of real
  resources (a job, a token, a webhook, a delivery), the token routes included.

Both expect zero failures. The schema states every rule it can (formats, patterns, `oneOf`, ranges);
the rules it cannot state are listed in RULES_BEYOND_THE_SCHEMA, each documented in the operation's
description: a schema-valid request refused with 422 by one of them is expected, and only such a
refusal (every field the 422 names must be one of the rule's). Two of them depend on the server's
state, and valid requests are kept within them so that they reach what follows: a page cursor is one
the server issued (generated ones are left out), and a reported time is within a day of the server's
clock (later ones are moved to now). Valid strings contain no NUL (`allow-x00` off; a phase that
ignores it has them removed): the API refuses NUL everywhere (PostgreSQL cannot store it), which
test_inputs.py tests field by field instead.
"""

from __future__ import annotations

import collections
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.config import SchemathesisConfig
from schemathesis.engine import events, from_schema
from schemathesis.generation.modes import GenerationMode

from tests.conftest import configure_env, postgres_database, tiny_spec
from tests.reliability.conftest import bare_app

# Cases per operation and generation mode (each phase draws up to this many).
EXAMPLES = {"postgresql": 12, "sqlite": 8}
STATEFUL_STEPS = 20
TOKEN_ROUTES = "^/v1/tokens"


@dataclass(frozen=True)
class Rule:
    """A rule the OpenAPI cannot state. A schema-valid request it refuses gets a 422 naming `fields`
    (a regex over the error's field), with `error_type` when the rule is a validator's (pydantic's
    value_error), or none when the route checks it against stored state."""

    operations: tuple[str, ...]
    fields: str
    error_type: str | None
    why: str


REPORTS = ("POST /v1/jobs/{job_id}/events", "POST /v1/jobs/{job_id}/heartbeats", "POST /v1/jobs/{job_id}/reports")
RULES_BEYOND_THE_SCHEMA = (
    Rule(
        ("POST /v1/jobs",),
        ".*",
        "value_error",
        "rules between a spec's fields: a kubernetes job's image and checkpoint directory, fault ranks "
        "within nodes x procs_per_node, timeouts that must outlast others, ...",
    ),
    Rule(("POST /v1/jobs/{job_id}/faults",), "rank", None, "the rank must be one of the job's"),
    Rule(
        ("POST /v1/jobs", "POST /v1/webhooks", "POST /v1/tokens", "POST /v1/objectives"),
        "project",
        None,
        "the project must exist and the caller hold a role in it",
    ),
    Rule(("POST /v1/jobs",), r"checkpoint\.resume_from", None, "the job resumed from must be one of the project"),
    Rule(("POST /v1/tokens",), "project|role", None, "a project role needs a project; cluster-admin has none"),
    Rule(("POST /v1/projects/{project}/bindings",), "body", "value_error", "exactly one of group or subject"),
    Rule(
        ("POST /v1/webhooks",),
        "url",
        None,
        "the host's addresses must be public (unless FTPLANE_WEBHOOK_ALLOW_PRIVATE) and resolve",
    ),
    Rule(("GET /v1/jobs", "GET /v1/webhooks/{webhook_id}/deliveries"), "cursor", None, "a cursor the server issued"),
    Rule(REPORTS, r".*\bts", "value_error", "a reported time at most a day ahead of the server's clock"),
    Rule(
        ("GET /v1/goodput",),
        "since|until|window|bucket",
        None,
        "since before until, in the years 1 to 9999 in UTC; since or window, not both; at most 1,000 buckets",
    ),
    Rule(
        ("GET /v1/jobs/{job_id}/logs",),
        "attempt|rank|node|cycle|cursor",
        None,
        "the attempt, rank and node must be the job's; a cursor the server issued, without tail and follow",
    ),
)


def refused_by_a_rule_beyond_the_schema(operation: str, status: int, body: bytes) -> bool:
    """Whether a 422 to a schema-valid request names only fields of the operation's rules."""
    if status != 422:
        return False
    try:
        fields = json.loads(body)["error"]["fields"] or []
    except (ValueError, KeyError, TypeError):
        return False
    rules = [rule for rule in RULES_BEYOND_THE_SCHEMA if operation in rule.operations]
    return bool(fields) and all(
        any(re.fullmatch(r.fields, f["field"]) and f.get("type") == r.error_type for r in rules) for f in fields
    )


class ServerState:
    """Keeps valid requests within the two rules that depend on the server's state (see the module's doc)."""

    def __init__(self) -> None:
        self.cursors: set[str] = set()  # every next_cursor the server returned
        self.moved = collections.Counter[str]()

    def issued(self, body: Any) -> None:
        if isinstance(body, dict) and isinstance(body.get("next_cursor"), str):
            self.cursors.add(body["next_cursor"])

    def valid(self, query: dict[str, Any] | None, body: Any) -> None:
        cursor = str(query.get("cursor")) if query and query.get("cursor") is not None else None
        if cursor is not None and cursor not in self.cursors and not cursor.isdigit():  # any number is an event id
            del query["cursor"]  # type: ignore[union-attr]
            self.moved["cursor left out"] += 1
        latest = datetime.now(UTC) + timedelta(hours=23)
        stack = [body]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                if isinstance(value.get("ts"), str) and not _plausible(value["ts"], latest):
                    value["ts"] = datetime.now(UTC).isoformat()
                    self.moved["ts moved to now"] += 1
                for key, item in list(value.items()):
                    if "\x00" in key or (isinstance(item, str) and "\x00" in item):
                        del value[key]
                        value[key.replace("\x00", "")] = item.replace("\x00", "") if isinstance(item, str) else item
                        self.moved["NUL removed"] += 1
                stack.extend(value.values())
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, str) and "\x00" in item:
                        value[i] = item.replace("\x00", "")
                        self.moved["NUL removed"] += 1
                stack.extend(value)


def _plausible(text: str, latest: datetime) -> bool:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return when.utcoffset() is None or EARLIEST <= when <= latest
    except (ValueError, OverflowError):
        return True  # not a time the server could read: its own refusal, as the schema says


EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass
class Target:
    app: Any
    token: str
    db: str
    examples: int
    ids: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    url = f"sqlite:///{tmp / 'ftplane.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_module")
    with pytest.MonkeyPatch.context() as monkeypatch:
        configure_env(monkeypatch, tmp / "state", url, FTPLANE_WEBHOOK_ALLOW_PRIVATE="true")
        from api.core import queue
        from api.core.db import reset_caches, session_scope
        from api.main import create_app
        from api.models import tokens

        # No broker and no worker here: work the API hands off is dropped (nothing may depend on it).
        monkeypatch.setattr(queue, "send", lambda *args, **kwargs: True)
        app = create_app()
        with session_scope() as session:
            _, token = tokens.create_admin(session, "fuzz")
        yield Target(app=app, token=token, db=request.param, examples=EXAMPLES[request.param])
        reset_caches()
    on_db = {k: n for k, n in CASES.items() if k.startswith(request.param + " ")}
    if on_db:
        operations = {k.rsplit(" ", 1)[0] for k in on_db}
        print(f"\nevery operation on {request.param}: {sum(on_db.values())} cases over {len(operations)} operations")


@pytest.fixture(scope="module")
def pg_module() -> Iterator[str]:
    """A PostgreSQL database for the whole module (the per-test fixture would make one per operation)."""
    with postgres_database() as url:
        yield url


def fresh_resources(target: Target) -> dict[str, str]:
    """A job, a token, a webhook and a delivery to aim path ids at."""
    from fastapi.testclient import TestClient

    admin = TestClient(target.app, headers={"Authorization": f"Bearer {target.token}"})
    job = admin.post("/v1/jobs", json=tiny_spec(name="fuzz-target")).json()
    token = admin.post("/v1/tokens", json={"name": "fuzz-victim"}).json()
    hook = admin.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": ["checkpoint_saved"]})
    trainer = {"Authorization": f"Bearer {job['token']}"}
    event = {"events": [{"key": "k0", "type": "checkpoint_saved", "step": 1}]}
    event["events"].append({"key": "k1", "type": "checkpoint_saved", "step": 2, "node": "fuzz-node"})
    assert admin.post(f"/v1/jobs/{job['id']}/events", json=event, headers=trainer).status_code == 200
    from api.core.db import session_scope
    from api.services import node_reputation

    with session_scope() as session:  # the fleet's ledger records the job's node
        node_reputation.run_once(session)
    deliveries = admin.get(f"/v1/webhooks/{hook.json()['id']}/deliveries").json()["items"]
    binding = admin.post("/v1/projects/default/bindings", json={"group": f"g-{job['id']}", "role": "viewer"}).json()
    objective = admin.post("/v1/objectives", json={"target": 0.9}).json()
    return {
        "job_id": job["id"],
        "token_id": token["id"],
        "webhook_id": hook.json()["id"],
        "delivery_id": deliveries[0]["id"],
        "project": "default",
        "binding_id": binding["id"],
        "name": "fuzz-node",
        "objective_id": objective["id"],
    }


# ---- the whole schema, every phase, every check ---------------------------------------------------------


def whole_schema(target: Target, state: ServerState) -> Any:
    config = SchemathesisConfig.from_dict(
        {
            "seed": 2026,
            "suppress-health-check": ["all"],  # big bodies and oneOf filters are what this API has
            "generation": {"max-examples": target.examples, "allow-x00": False, "deterministic": True},
            "checks": {"enabled": True},
            "phases": {"stateful": {"max-steps": STATEFUL_STEPS}},
            "headers": {"Authorization": f"Bearer {target.token}"},
            "operations": [{"include-path-regex": TOKEN_ROUTES, "enabled": False}],
        }
    )
    schema = schemathesis.openapi.from_asgi("/openapi.json", target.app, config=config)

    @schema.hook("map_case")
    def within_server_state(context: Any, case: Any) -> Any:
        if case.meta is not None and case.meta.generation.mode.is_positive:
            state.valid(case.query, case.body)
        return case

    @schema.hook("after_call")
    def record_cursors(context: Any, case: Any, response: Any) -> None:
        with contextlib.suppress(ValueError):
            state.issued(json.loads(response.content))

    @schema.hook("filter_failure")
    def rules_beyond_the_schema(context: Any, failure: Any, case: Any, response: Any) -> bool:
        positive = case.meta is not None and case.meta.generation.mode.is_positive
        documented = positive and refused_by_a_rule_beyond_the_schema(
            case.operation.label, response.status_code, response.content
        )
        return not (type(failure).__name__ == "RejectedPositiveData" and documented)

    return schema


# ~37 CPU-s of cases alone; beside the suite's jobs on a slow 2-core machine it got a third of a core and outlasted
# the suite's 300 s per test (a limit for hangs, not for CPU-bound work).
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("target", ["sqlite"], indirect=True)  # PostgreSQL's own refusals: below
def test_the_whole_schema_fuzzes_clean(target: Target) -> None:
    fresh_resources(target)  # something for the list operations to lead to from the start
    state = ServerState()
    schema = whole_schema(target, state)
    cases: collections.Counter[str] = collections.Counter()
    operations: set[str] = set()
    failures: dict[tuple[str, str, bytes], str] = {}
    errors: list[str] = []
    dropped = 0
    links: Any = None
    for event in from_schema(schema).execute():
        if isinstance(event, events.PhaseStarted) and event.payload is not None:
            links = event.payload
        elif isinstance(event, events.ScenarioFinished):
            recorder = event.recorder
            cases[event.phase.value] += len(recorder.cases)
            operations.add(recorder.label)
            dropped += sum(recorder.filtered_failures.values())
            for case_id, checks in recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        interaction = recorder.interactions.get(case_id)
                        answer = interaction.response.content[:500] if interaction and interaction.response else b""
                        title = check.failure_info.failure.title
                        text = f"{title}, answered: {answer!r}\n{check.failure_info.code_sample}"
                        failures.setdefault((recorder.label, title, answer[:80]), text)
        elif isinstance(event, events.NonFatalError | events.FatalError):
            errors.append(str(getattr(event, "info", event))[:2000])

    phases = ", ".join(f"{n} {phase}" for phase, n in cases.items())
    print(
        f"\nwhole schema on {target.db}: {sum(cases.values())} cases ({phases})"
        f" over {len(operations - {'Stateful tests'})} operations; stateful links: "
        f"{links.transitions_total if links else 0} ({links.inferred_transitions if links else 0} inferred); "
        f"{dropped} refusals by rules beyond the schema; kept valid: {dict(state.moved)}; "
        f"{len(failures)} failures, {len(errors)} errors"
    )
    assert not errors, "\n\n".join(errors[:5])
    assert not failures, f"{len(failures)} distinct failure(s):\n\n" + "\n\n".join(
        f"{operation}: {text[:1500]}" for (operation, _, _), text in list(failures.items())[:12]
    )
    assert cases["coverage"] and cases["fuzzing"] and cases["stateful"], cases
    assert links is not None and links.transitions_total >= 15, "the OpenAPI links are missing"


# ---- every operation on its own, with real ids ----------------------------------------------------------


def _operations() -> list[str]:
    paths = bare_app().openapi()["paths"]
    return sorted(f"{method.upper()} {path}" for path, item in paths.items() for method in item)


OPERATIONS = _operations()
CASES: collections.Counter[str] = collections.Counter()


@pytest.mark.parametrize("operation", OPERATIONS)
def test_operation_answers_as_documented(target: Target, operation: str) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", target.app)
    schema.config.generation.update(allow_x00=False)
    found = schema.find_operation_by_label(operation)
    assert found is not None, f"{operation} is in the OpenAPI but schemathesis cannot find it"
    ids = fresh_resources(target)
    failures: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {target.token}"}
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        fuzz(found, mode, ids, target.examples, headers, failures, counter=f"{target.db} {operation} {mode.value}")

    assert CASES[f"{target.db} {operation} positive"] + CASES[f"{target.db} {operation} negative"] > 0
    assert not failures, f"{len(failures)} distinct failure(s) of {operation}:\n\n" + "\n\n".join(
        text[:3000] for text in list(failures.values())[:5]
    )


def fuzz(
    operation: Any,
    mode: GenerationMode,
    ids: dict[str, str],
    examples: int,
    headers: dict[str, str],
    failures: dict[str, str],
    counter: str,
) -> None:
    """Run the cases of one operation in one mode; distinct failures go to `failures`."""
    state = ServerState()  # no cursor was issued here: valid requests carry none

    @settings(
        max_examples=examples,
        derandomize=True,  # the same cases on every run
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), real_ids=st.booleans())
    def run(case: Any, real_ids: bool) -> None:
        if real_ids and case.path_parameters:
            case.path_parameters = {k: ids.get(k, v) for k, v in case.path_parameters.items()}
        if mode == GenerationMode.POSITIVE:
            state.valid(case.query, case.body)
        CASES[counter] += 1
        response = case.call(headers=headers)
        try:
            case.validate_response(response, headers=headers)
        except (Exception, BaseExceptionGroup) as exc:  # collect every distinct failure; report them together
            rest = [f for f in getattr(exc, "exceptions", [exc]) if not documented(f, response)]
            if rest:
                failures.setdefault(_signature(rest), f"{mode.value}: {exc}")

    def documented(failure: BaseException, response: Any) -> bool:
        return (
            mode == GenerationMode.POSITIVE
            and type(failure).__name__ == "RejectedPositiveData"
            and refused_by_a_rule_beyond_the_schema(operation.label, response.status_code, response.content)
        )

    try:
        run()
    except Unsatisfiable:
        # Nothing in this operation can be made invalid in this mode (e.g. only free-text path ids):
        # hypothesis finds no case to run.
        assert mode == GenerationMode.NEGATIVE, f"no valid request could be generated for {counter}"


def _signature(failures: list[BaseException]) -> str:
    return " | ".join(sorted({type(f).__name__ + ": " + str(f).splitlines()[0] for f in failures}))


def test_every_operation_is_fuzzed_and_every_rule_names_one() -> None:
    """A new route shows up here by itself: the operation list comes from the app's OpenAPI."""
    assert "POST /v1/jobs/{job_id}/events" in OPERATIONS and "POST /v1/jobs" in OPERATIONS
    named = {operation for rule in RULES_BEYOND_THE_SCHEMA for operation in rule.operations}
    assert named <= set(OPERATIONS), f"a rule names an operation that is gone: {named - set(OPERATIONS)}"


def test_a_405_names_every_method_its_path_takes() -> None:
    """Starlette's own 405 named the methods of the first route that matched the path only."""
    from fastapi.testclient import TestClient

    app = bare_app()
    client = TestClient(app)
    for path, item in app.openapi()["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        answer = client.request("OPTIONS", concrete)
        assert answer.status_code == 405, (path, answer.status_code)
        assert set(answer.headers["allow"].split(", ")) == {m.upper() for m in item}, (path, answer.headers["allow"])


def test_a_method_no_route_takes_is_405_whatever_its_body_holds() -> None:
    """The text guard checked the body of a PUT no route serves and answered 422 (found by the fuzz)."""
    from fastapi.testclient import TestClient

    client = TestClient(bare_app())
    answer = client.put("/v1/jobs", json={"command": ["python", "a\x00b"]})
    assert answer.status_code == 405, answer.text
    assert "POST" in answer.headers["allow"]
    refused = client.post("/v1/jobs", json={"command": ["python", "a\x00b"]})
    assert refused.status_code == 422 and refused.json()["error"]["fields"][0]["field"] == "command[1]", refused.text
