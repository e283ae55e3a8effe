"""`/v1/projects`: projects (made and changed by cluster admins) and their role bindings (by their admins)."""

from __future__ import annotations

from fastapi import APIRouter, status

from api import models
from api.core.authz import Role
from api.core.errors import ApiError, responses
from api.core.openapi import link, links
from api.deps import AuditDep, ClusterAdminDep, MemberDep, ProjectAdminDep, ProjectViewerDep, SessionDep
from api.schemas.projects import BindingIn, BindingOut, ProjectIn, ProjectOut, ProjectUpdate

router = APIRouter(prefix="/v1/projects", tags=["projects"])

_PROJECT = "$response.body#/name"


@router.post(
    "",
    response_model=ProjectOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        **responses(409),
        **links(
            201,
            GetProject=link("GET", "/v1/projects/{project}", "The project.", project=_PROJECT),
            ListBindings=link("GET", "/v1/projects/{project}/bindings", "Its role bindings.", project=_PROJECT),
        ),
    },
)
def create_project(body: ProjectIn, session: SessionDep, _: ClusterAdminDep, audit: AuditDep) -> ProjectOut:
    """Make a project (cluster admins). A name in use is refused with 409."""
    if models.projects.get(session, body.name) is not None:
        raise ApiError(409, f"project {body.name!r} exists already", field="name")
    row = models.projects.create(session, body.name, body.gpu_limit)
    if audit is not None:
        audit.about(object_id=row.name, project=row.name, gpu_limit=row.gpu_limit)
    return ProjectOut.model_validate(row)


@router.get("", response_model=list[ProjectOut])
def list_projects(session: SessionDep, principal: MemberDep) -> list[ProjectOut]:
    """Every project, for a cluster admin; the projects the caller holds a role in, for anyone else."""
    return [ProjectOut.model_validate(p) for p in models.projects.list_projects(session, principal.projects())]


@router.get("/{project}", response_model=ProjectOut, responses=responses(404))
def get_project(project: str, session: SessionDep, _: ProjectViewerDep) -> ProjectOut:
    row = models.projects.get(session, project)
    assert row is not None  # the dependency answered 404 otherwise
    return ProjectOut.model_validate(row)


@router.patch("/{project}", response_model=ProjectOut, responses=responses(404))
def update_project(
    project: str, body: ProjectUpdate, session: SessionDep, _: ClusterAdminDep, audit: AuditDep
) -> ProjectOut:
    """Change a project's GPU limit (cluster admins). Jobs admitted already keep running; waiting ones are
    admitted under the new limit on the next launch pass."""
    row = models.projects.get(session, project, for_update=True)
    if row is None:
        raise ApiError(404, f"no project {project!r}", field="project")
    row.gpu_limit = body.gpu_limit
    if audit is not None:
        audit.about(project=project, gpu_limit=body.gpu_limit)
    return ProjectOut.model_validate(row)


_BINDING_LINKS = links(
    201,
    DeleteBinding=link(
        "DELETE",
        "/v1/projects/{project}/bindings/{binding_id}",
        "Remove the binding.",
        project="$request.path.project",
        binding_id="$response.body#/id",
    ),
)


@router.post(
    "/{project}/bindings",
    response_model=BindingOut,
    status_code=status.HTTP_201_CREATED,
    responses={**responses(404, 409), **_BINDING_LINKS},
)
def create_binding(
    project: str, body: BindingIn, session: SessionDep, _: ProjectAdminDep, audit: AuditDep
) -> BindingOut:
    """Give a role in the project to the callers whose JWT lists `group` in its groups claim
    (FTPLANE_OIDC_GROUPS_CLAIM), or whose `sub` is `subject` (the project's admins). The same group or subject
    bound twice is refused with 409: remove the binding first."""
    kind, value = ("group", body.group) if body.group is not None else ("subject", body.subject)
    assert value is not None
    if models.projects.find_binding(session, project, kind, value) is not None:
        raise ApiError(409, f"{kind} {value!r} is bound in project {project!r} already", field=kind)
    row = models.projects.bind(session, project, kind, value, Role(body.role))
    if audit is not None:
        audit.about(object_id=row.id, kind=kind, value=value, role=body.role)
    return BindingOut.model_validate(row)


@router.get("/{project}/bindings", response_model=list[BindingOut], responses=responses(404))
def list_bindings(project: str, session: SessionDep, _: ProjectAdminDep) -> list[BindingOut]:
    return [BindingOut.model_validate(b) for b in models.projects.bindings(session, project)]


@router.delete("/{project}/bindings/{binding_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(404))
def delete_binding(project: str, binding_id: str, session: SessionDep, _: ProjectAdminDep) -> None:
    if not models.projects.unbind(session, project, binding_id):
        raise ApiError(404, f"no binding {binding_id!r} in project {project!r}", field="binding_id")
