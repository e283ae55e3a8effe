"""`/v1/objectives`: ETTR objectives of a project's jobs, their budgets and breaches (a project's admins create and
delete them; its viewers read them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Request, status

from api.core.authz import Role
from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.database.tables import Objective
from api.deps import AuditDep, MemberDep, SessionDep, authorize, project_for
from api.schemas.fleet import ObjectiveIn, ObjectiveOut
from api.services.fleet import objectives

router = APIRouter(prefix="/v1/objectives", tags=["objectives"])


def _missing(objective_id: str) -> ApiError:
    return ApiError(404, f"no objective with id {objective_id!r}", field="objective_id")


def _objective_with(needed: Role) -> Callable[..., Objective]:
    def load(request: Request, objective_id: str, session: SessionDep, principal: MemberDep) -> Objective:
        """The objective, when the caller holds `needed` in its project (no role there: 404, as for none)."""
        row = objectives.get(session, objective_id)
        if row is None:
            raise _missing(objective_id)
        trail = getattr(request.state, "audit", None)
        if trail is not None:
            trail.about(project=row.project)
        if principal.role_in(row.project) is None:
            raise _missing(objective_id)
        authorize(principal, row.project, needed, f"objective with id {objective_id!r}", "objective_id")
        return row

    return load


ViewedDep = Annotated[Objective, Depends(_objective_with(Role.viewer))]
AdministeredDep = Annotated[Objective, Depends(_objective_with(Role.admin))]
_ID = "$response.body#/id"


@router.post(
    "",
    response_model=ObjectiveOut,
    status_code=status.HTTP_201_CREATED,
    responses=links(
        201,
        GetObjective=link("GET", "/v1/objectives/{objective_id}", "The objective now.", objective_id=_ID),
        DeleteObjective=link("DELETE", "/v1/objectives/{objective_id}", "Remove it.", objective_id=_ID),
    ),
)
def create_objective(
    body: ObjectiveIn, request: Request, session: SessionDep, principal: MemberDep, audit: AuditDep
) -> ObjectiveOut:
    """An ETTR objective for the project's jobs that carry `selector`: a target over a rolling window. The
    evaluate_objectives duty sends one signed `objective_breached` webhook per breach (to the project's
    subscriptions that ask for it): when the window's ETTR falls below the target, or the budget burns faster than
    `burn_rate`. The caller must be an admin of the project (an unknown project, or one the caller holds no role
    in: 422 naming it)."""
    project_for(session, request, principal, body.project, Role.admin)
    row = objectives.create(session, body)
    if audit is not None:
        audit.about(object_id=row.id)
    return objectives.out(row, None)


@router.get("", response_model=list[ObjectiveOut])
def list_objectives(session: SessionDep, principal: MemberDep) -> list[ObjectiveOut]:
    """The objectives of the projects the caller holds a role in, each evaluated now."""
    rows = objectives.list_all(session, principal.projects(Role.viewer))
    return [objectives.out(row, objectives.evaluate(session, row)) for row in rows]


@router.get("/{objective_id}", response_model=ObjectiveOut, responses=responses(404))
def get_objective(objective: ViewedDep, session: SessionDep) -> ObjectiveOut:
    """The objective now: the window's ETTR, the budget left, the burn rate, the causes and the jobs that spent
    the most of it."""
    return objectives.out(objective, objectives.evaluate(session, objective))


@router.delete("/{objective_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404))
def delete_objective(objective: AdministeredDep, session: SessionDep) -> None:
    """Remove the objective and its breaches' history."""
    objectives.remove(session, objective)
