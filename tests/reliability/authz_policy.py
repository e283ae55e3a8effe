"""The authorization matrix's policy: what each endpoint needs, the callers, and the status each caller must get
(tests/reliability/test_authz.py runs it)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from fastapi.routing import iter_route_contexts
from starlette.routing import Mount

from tests.conftest import tiny_spec
from tests.reliability.conftest import bare_app

A, B = "team-a", "team-b"
PUBLIC = "public"  # the same answer whoever asks (probes, metrics, docs, the login forms, static files)
VIEWER = "viewer"  # the role needed in project A (the project of every object in the paths)
OPERATOR = "operator"
ADMIN = "admin"
CLUSTER = "cluster-admin"  # cluster admins only
MEMBER = "member"  # anyone but a trainer token: a list of what the caller's roles let it see
REPORTER = "reporter"  # the trainer token of the job in the path, or an operator of its project
DASHBOARD = "dashboard"  # a page: anyone but a trainer; a job's page needs viewer of its project
AUDIT = "audit"  # an admin of some project (rows of the projects it administers), or a cluster admin
CLUSTER_PAGE = "cluster-page"  # a page of the fleet's: cluster admins; others signed in get 403 naming the role

POLICY: dict[str, str] = {
    "GET /openapi.json": PUBLIC,
    "GET /docs": PUBLIC,
    "GET /docs/oauth2-redirect": PUBLIC,
    "GET /redoc": PUBLIC,
    "GET /healthz": PUBLIC,
    "GET /readyz": PUBLIC,
    "GET /metrics": PUBLIC,
    "GET /login": PUBLIC,
    "POST /login": PUBLIC,
    "POST /logout": PUBLIC,
    "GET /login/sso": PUBLIC,
    "GET /login/sso/callback": PUBLIC,
    "MOUNT /static": PUBLIC,
    "POST /v1/jobs": OPERATOR,
    "GET /v1/jobs": MEMBER,
    "GET /v1/jobs/{job_id}": VIEWER,
    "POST /v1/jobs/{job_id}/cancel": OPERATOR,
    "POST /v1/jobs/{job_id}/faults": OPERATOR,
    "POST /v1/jobs/{job_id}/events": REPORTER,
    "GET /v1/jobs/{job_id}/events": VIEWER,
    "POST /v1/jobs/{job_id}/heartbeats": REPORTER,
    "POST /v1/jobs/{job_id}/reports": REPORTER,
    "GET /v1/jobs/{job_id}/nodes": VIEWER,
    "GET /v1/jobs/{job_id}/ranks": VIEWER,
    "GET /v1/jobs/{job_id}/goodput": VIEWER,
    "GET /v1/jobs/{job_id}/logs": VIEWER,
    "POST /v1/tokens": ADMIN,
    "GET /v1/tokens": MEMBER,
    "DELETE /v1/tokens/{token_id}": ADMIN,
    "POST /v1/webhooks": ADMIN,
    "GET /v1/webhooks": MEMBER,
    "GET /v1/webhooks/{webhook_id}": ADMIN,
    "DELETE /v1/webhooks/{webhook_id}": ADMIN,
    "GET /v1/webhooks/{webhook_id}/deliveries": ADMIN,
    "POST /v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver": ADMIN,
    "POST /v1/projects": CLUSTER,
    "GET /v1/projects": MEMBER,
    "GET /v1/projects/{project}": VIEWER,
    "PATCH /v1/projects/{project}": CLUSTER,
    "POST /v1/projects/{project}/bindings": ADMIN,
    "GET /v1/projects/{project}/bindings": ADMIN,
    "DELETE /v1/projects/{project}/bindings/{binding_id}": ADMIN,
    "GET /v1/audit": AUDIT,
    "GET /v1/goodput": AUDIT,  # the same rule: a project's admins see their projects' jobs, cluster admins all
    "POST /v1/objectives": ADMIN,
    "GET /v1/objectives": MEMBER,
    "GET /v1/objectives/{objective_id}": VIEWER,
    "DELETE /v1/objectives/{objective_id}": ADMIN,
    "GET /v1/nodes": CLUSTER,
    "GET /v1/nodes/{name}": CLUSTER,
    "POST /v1/nodes/{name}/release": CLUSTER,
    "GET /": DASHBOARD,
    "GET /ui/jobs": DASHBOARD,
    "GET /jobs/{job_id}": DASHBOARD,
    "GET /ui/jobs/{job_id}/live": DASHBOARD,
    "GET /fleet": DASHBOARD,  # a project's admins see their projects' jobs, cluster admins all, others what it needs
    "GET /nodes": CLUSTER_PAGE,
    "GET /ui/nodes": CLUSTER_PAGE,
    "GET /nodes/{name}": CLUSTER_PAGE,
}

# Where the body names project A, a caller without a role there is told the project is unknown (422).
PROJECT_IN_BODY = {"POST /v1/jobs", "POST /v1/tokens", "POST /v1/webhooks", "POST /v1/objectives"}
# Node traffic: not audited.
INGEST = {"POST /v1/jobs/{job_id}/events", "POST /v1/jobs/{job_id}/heartbeats", "POST /v1/jobs/{job_id}/reports"}
# What each endpoint is sent (a valid request, so that an allowed caller succeeds).
BODIES: dict[str, Callable[[], dict[str, Any]]] = {
    "POST /v1/jobs": lambda: {"json": tiny_spec(name="authz", project=A)},
    "POST /v1/jobs/{job_id}/faults": lambda: {"json": {"kind": "exception", "rank": 0, "at_step": 5}},
    "POST /v1/jobs/{job_id}/events": lambda: {
        "json": {"events": [{"key": uuid.uuid4().hex, "type": "checkpoint_saved", "step": 7}]}
    },
    "POST /v1/jobs/{job_id}/heartbeats": lambda: {"json": {"heartbeats": [{"rank": 0, "step": 7}]}},
    "POST /v1/jobs/{job_id}/reports": lambda: {
        "json": {"attempt": 0, "node": "n0", "heartbeats": [{"rank": 0, "step": 7}]}
    },
    "POST /v1/tokens": lambda: {"json": {"name": "authz", "project": A, "role": "viewer"}},
    "POST /v1/webhooks": lambda: {"json": {"url": "http://127.0.0.1:9/hook", "project": A}},
    "POST /v1/projects": lambda: {"json": {"name": f"p-{uuid.uuid4().hex[:10]}"}},
    "PATCH /v1/projects/{project}": lambda: {"json": {"gpu_limit": None}},
    "POST /v1/projects/{project}/bindings": lambda: {"json": {"group": f"g-{uuid.uuid4().hex[:8]}", "role": "viewer"}},
    "POST /login": lambda: {"data": {"token": "not-a-token", "next": "/"}},
    "POST /v1/nodes/{name}/release": lambda: {"json": {"reason": "authz"}},
    "POST /v1/objectives": lambda: {"json": {"project": A, "target": 0.9, "window": "7d"}},
}
# Endpoints whose success removes their object: each call is aimed at a fresh one.
DESTRUCTIVE = {
    "DELETE /v1/tokens/{token_id}": "token_id",
    "DELETE /v1/webhooks/{webhook_id}": "webhook_id",
    "DELETE /v1/projects/{project}/bindings/{binding_id}": "binding_id",
    "DELETE /v1/objectives/{objective_id}": "objective_id",
}

CALLERS = (
    "nobody",
    "bad_token",
    "own_trainer",
    "other_trainer",
    "viewer_b",
    "operator_b",
    "admin_b",
    "viewer_a",
    "operator_a",
    "jwt_viewer_a",
    "jwt_operator_a",
    "admin_a",
    "jwt_admin_a",
    "cluster_admin",
    "jwt_cluster_admin",
)
ROLE_IN_A = {
    "viewer_a": VIEWER,
    "jwt_viewer_a": VIEWER,
    "operator_a": OPERATOR,
    "jwt_operator_a": OPERATOR,
    "admin_a": ADMIN,
    "jwt_admin_a": ADMIN,
    "cluster_admin": CLUSTER,
    "jwt_cluster_admin": CLUSTER,
}
RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3, CLUSTER: 4}
IN_B = {"viewer_b", "operator_b", "admin_b"}


def endpoints() -> list[str]:
    """Every route of the app, as 'METHOD /path' ('MOUNT /path' for mounted apps)."""
    app = bare_app()
    found = set()
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, Mount):
            found.add(f"MOUNT {context.path}")
            continue
        for method in getattr(route, "methods", None) or ():
            if method != "HEAD":
                found.add(f"{method} {context.path}")
    return sorted(found)


ENDPOINTS = endpoints()


def expected(policy: str, endpoint: str, caller: str) -> int | str:
    """The status `caller` must get (or "ok": any 2xx, "login": sent to the login form)."""
    page = policy in (DASHBOARD, CLUSTER_PAGE)
    if caller in ("nobody", "bad_token"):
        return "login" if page else 401
    if policy == REPORTER:
        if caller == "own_trainer":
            return "ok"
        if caller == "other_trainer":
            return 403
    elif caller in ("own_trainer", "other_trainer"):
        return "login" if page else 403
    if policy in (MEMBER, DASHBOARD) and not (policy == DASHBOARD and "{job_id}" in endpoint):
        return "ok"
    if policy == AUDIT:
        return "ok" if caller == "admin_b" or RANK.get(ROLE_IN_A.get(caller, ""), 0) >= RANK[ADMIN] else 403
    if policy == DASHBOARD and caller in IN_B:  # as for a job that does not exist
        return 286 if endpoint.endswith("/live") else 404
    needed = {REPORTER: OPERATOR, DASHBOARD: VIEWER, CLUSTER_PAGE: CLUSTER}.get(policy, policy)
    if needed == CLUSTER:
        return "ok" if ROLE_IN_A.get(caller) == CLUSTER else 403
    if caller in IN_B:
        return 422 if endpoint in PROJECT_IN_BODY else 404
    return "ok" if RANK[ROLE_IN_A[caller]] >= RANK[needed] else 403
