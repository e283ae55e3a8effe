"""`/v1/nodes`: every node ftplane has run on, across jobs: its state, the faults blamed on it, where it ran, and
its release (cluster admins; a project's viewers see the nodes of its jobs at `/v1/jobs/{id}/nodes`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.deps import AuditDep, ClusterAdminDep, SessionDep
from api.schemas.events import utcnow
from api.schemas.fleet_nodes import (
    NODE_NAME_DESCRIPTION,
    NODE_NAME_PATTERN,
    NodeDetail,
    NodePage,
    NodeState,
    ReleaseIn,
)
from api.services import node_reputation
from api.services.node_reputation import views
from ftplane import contract

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])

NodeName = Annotated[
    str,
    Path(min_length=1, max_length=contract.MAX_NODE_NAME, pattern=NODE_NAME_PATTERN, description=NODE_NAME_DESCRIPTION),
]
_NODE = "$response.body#/name"


@router.get(
    "",
    response_model=NodePage,
    responses=links(
        200,
        NextPage=link("GET", "/v1/nodes", "The next page.", cursor="$response.body#/next_cursor"),
    ),
)
def list_nodes(
    session: SessionDep,
    _: ClusterAdminDep,
    state: NodeState | None = Query(default=None, description="Only the nodes in this state."),
    cursor: str | None = Query(
        default=None,
        max_length=contract.MAX_NODE_NAME,
        pattern=NODE_NAME_PATTERN,
        description="The next_cursor of the previous page (the name it ended with).",
    ),
    limit: int = Query(default=100, ge=1, le=1000),
) -> NodePage:
    """Every node ftplane has run on, in name order, with its state, the faults blamed on it by kind, its newest
    fault and how many jobs ran on it."""
    return views.page(session, state=state, cursor=cursor, limit=limit)


@router.get("/{name}", response_model=NodeDetail, responses=responses(404))
def get_node(name: NodeName, session: SessionDep, _: ClusterAdminDep) -> NodeDetail:
    """One node: its state and why, its faults (counted by kind, and the newest listed), the jobs and attempts
    that ran on it, and its history."""
    found = views.detail(session, name)
    if found is None:
        raise ApiError(404, f"no node {name!r}: ftplane has not seen a job run on it", field="name")
    return found


@router.post(
    "/{name}/release",
    response_model=NodeDetail,
    responses={
        **responses(404),
        **links(200, GetNode=link("GET", "/v1/nodes/{name}", "The node.", name=_NODE)),
    },
)
def release_node(
    name: NodeName, body: ReleaseIn, session: SessionDep, principal: ClusterAdminDep, audit: AuditDep
) -> NodeDetail:
    """Release the node: every fault blamed on it so far is forgiven and it is healthy again, placed like any
    other node from the next launch on. A quarantined node's `node_released` event goes where its
    `node_quarantined` went. The reason is kept in its history and the audit log."""
    released = node_reputation.release(session, name, body.reason, principal.label, utcnow())
    if released is None:
        raise ApiError(404, f"no node {name!r}: ftplane has not seen a job run on it", field="name")
    if audit is not None:
        audit.about(object_id=name, reason=body.reason)
    session.flush()
    found = views.detail(session, name)
    assert found is not None
    return found
