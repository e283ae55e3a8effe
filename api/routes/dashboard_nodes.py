"""The dashboard's nodes pages (cluster admins): every node with its state and blamed faults (`/nodes`, its rows
polled at `/ui/nodes`), and one node (`/nodes/{name}`) with its faults, runs and history, and a form that
releases it through the API (`POST /v1/nodes/{name}/release`, with the session cookie)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from api.core.authz import CLUSTER_ADMIN, Principal
from api.deps import SessionDep
from api.routes.dashboard import ViewerDep, _page, _to_login
from api.schemas.fleet_nodes import NodeState, fleet_name
from api.services.node_reputation import views

router = APIRouter(include_in_schema=False)

PAGE_ROWS = 500


def _state(state: str | None) -> NodeState | None:
    return NodeState(state) if state in {s.value for s in NodeState} else None


def _forbidden(request: Request, who: Principal) -> Response:
    context = {"who": who.label, "role": CLUSTER_ADMIN}
    return _page(request, "nodes_forbidden.html", context, status_code=403)


def _rows(session: SessionDep, state: str | None) -> dict[str, Any]:
    wanted = _state(state)
    page = views.page(session, state=wanted, cursor=None, limit=PAGE_ROWS)
    return {"nodes": page.nodes, "more": page.next_cursor is not None, "state": wanted, "states": list(NodeState)}


@router.get("/nodes", response_class=HTMLResponse)
def nodes_page(request: Request, session: SessionDep, who: ViewerDep, state: str | None = None) -> Response:
    if who is None:
        return _to_login(request)
    if not who.cluster_admin:
        return _forbidden(request, who)
    return _page(request, "nodes.html", _rows(session, state))


@router.get("/ui/nodes", response_class=HTMLResponse)
def nodes_rows(request: Request, session: SessionDep, who: ViewerDep, state: str | None = None) -> Response:
    if who is None:
        return _to_login(request, partial=True)
    if not who.cluster_admin:
        return _forbidden(request, who)
    return _page(request, "_nodes_rows.html", _rows(session, state))


@router.get("/nodes/{name}", response_class=HTMLResponse)
def node_page(request: Request, name: str, session: SessionDep, who: ViewerDep) -> Response:
    if who is None:
        return _to_login(request)
    if not who.cluster_admin:
        return _forbidden(request, who)
    known = fleet_name(name)
    node = views.detail(session, known) if known == name else None
    if node is None:
        return _page(request, "nodes_forbidden.html", {"missing": name}, status_code=404)
    return _page(request, "node.html", {"node": node})
