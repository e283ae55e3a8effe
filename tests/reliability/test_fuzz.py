"""Fuzz every operation of the OpenAPI with schemathesis, in process, as an admin.

For each operation, valid (positive) and invalid (negative) requests generated from the schema, with
a fixed seed and a bounded number of examples; path ids are either generated or those of real
resources, so requests also reach past the 404. Every response must be documented (status code,
content type, headers, body schema), never a 5xx, and invalid requests must be refused.
Runs on SQLite and on PostgreSQL (which refuses more: NUL in text, NaN in JSON).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.conftest import configure_env, postgres_database, tiny_spec
from tests.reliability.conftest import bare_app

# Cases per operation and mode. PostgreSQL refuses more than SQLite (NUL in text, NaN in JSON), so
# it gets the larger share of the time budget.
EXAMPLES_PER_MODE = {"postgresql": 20, "sqlite": 8}
OPAQUE = "cursor"

# Operations where a schema-valid request may still be refused, by rules JSON Schema cannot say:
# the check that valid data is accepted (ST202) is skipped for them; every other check runs.
CROSS_FIELD_RULES = {
    "POST /v1/jobs": "backend-dependent fields (local: nodes 1; kubernetes: image), fault ranks < world size, "
    "hard timeout > soft timeout, no FTPLANE_ env",
    "POST /v1/jobs/{job_id}/faults": "the rank must be one of the job's; exactly one of at_step or now",
    "POST /v1/webhooks": "URL policy: http(s) with a host and no credentials",
}


def _operations() -> list[str]:
    app = bare_app()
    paths = app.openapi()["paths"]
    return sorted(f"{method.upper()} {path}" for path, item in paths.items() for method in item)


OPERATIONS = _operations()
CASES: collections.Counter[str] = collections.Counter()


@dataclass
class Target:
    app: Any
    schema: Any
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
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        # The API refuses NUL in all text (PostgreSQL cannot store it), which no schema can say for
        # every string: test_inputs.py sends NUL everywhere instead.
        schema.config.generation.update(allow_x00=False)
        yield Target(app=app, schema=schema, token=token, db=request.param, examples=EXAMPLES_PER_MODE[request.param])
        reset_caches()
    on_db = {k: n for k, n in CASES.items() if k.startswith(request.param + " ")}
    print(f"\nfuzzed on {request.param}: {sum(on_db.values())} cases over {len(on_db)} operation-modes")


@pytest.fixture(scope="module")
def pg_module() -> Iterator[str]:
    """A PostgreSQL database for the whole module (the per-test fixture would make one per operation)."""
    with postgres_database() as url:
        yield url


def fresh_resources(target: Target) -> dict[str, str]:
    """A job, a token, a webhook and a delivery to aim path ids at (made again for each operation)."""
    from fastapi.testclient import TestClient

    admin = TestClient(target.app, headers={"Authorization": f"Bearer {target.token}"})
    job = admin.post("/v1/jobs", json=tiny_spec(name="fuzz-target")).json()
    token = admin.post("/v1/tokens", json={"name": "fuzz-victim"}).json()
    hook = admin.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/hook", "event_types": ["checkpoint_saved"]})
    trainer = {"Authorization": f"Bearer {job['token']}"}
    event = {"events": [{"key": "k0", "type": "checkpoint_saved", "step": 1}]}
    assert admin.post(f"/v1/jobs/{job['id']}/events", json=event, headers=trainer).status_code == 200
    deliveries = admin.get(f"/v1/webhooks/{hook.json()['id']}/deliveries").json()["items"]
    return {
        "job_id": job["id"],
        "token_id": token["id"],
        "webhook_id": hook.json()["id"],
        "delivery_id": deliveries[0]["id"],
    }


@pytest.mark.parametrize("operation", OPERATIONS)
def test_operation_answers_as_documented(target: Target, operation: str) -> None:
    found = target.schema.find_operation_by_label(operation)
    assert found is not None, f"{operation} is in the OpenAPI but schemathesis cannot find it"
    ids = fresh_resources(target)
    excluded = [positive_data_acceptance] if operation in CROSS_FIELD_RULES else []
    failures: dict[str, str] = {}
    headers = {"Authorization": f"Bearer {target.token}"}
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
        fuzz(
            found,
            mode,
            ids,
            target.examples,
            headers,
            excluded,
            failures,
            counter=f"{target.db} {operation} {mode.value}",
        )

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
    excluded: list[Any],
    failures: dict[str, str],
    counter: str,
) -> None:
    """Run the cases of one operation in one mode; distinct failures go to `failures`."""

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
            # Values valid only relative to the server's state, which a schema cannot say: a cursor
            # the server returned, and report times near the server's clock (after 2000, at most a
            # day ahead). Generated ones are left out of valid requests; invalid ones keep them.
            if case.query and OPAQUE in case.query:
                del case.query[OPAQUE]
            _server_clock_times(case.body)
        CASES[counter] += 1
        try:
            case.call_and_validate(headers=headers, excluded_checks=excluded)
        except (Exception, BaseExceptionGroup) as exc:  # collect every distinct failure; report them together
            failures.setdefault(_signature(exc), f"{mode.value}: {exc}")

    try:
        run()
    except Unsatisfiable:
        # Nothing in this operation can be made invalid in this mode (e.g. only free-text path ids):
        # hypothesis finds no case to run.
        assert mode == GenerationMode.NEGATIVE, f"no valid request could be generated for {counter}"


def _server_clock_times(body: Any) -> None:
    """Report times (`ts`, nullable) set to null: the server then takes its own clock."""
    stack = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "ts" in value:
                value["ts"] = None
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _signature(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.startswith("- ") or "Received:" in line]
    return " | ".join(lines) or type(exc).__name__


def test_every_operation_is_fuzzed() -> None:
    """A new route shows up here by itself: the operation list comes from the app's OpenAPI."""
    assert "POST /v1/jobs/{job_id}/events" in OPERATIONS and "POST /v1/jobs" in OPERATIONS
    assert set(CROSS_FIELD_RULES) <= set(OPERATIONS), "a skipped check names an operation that is gone"
