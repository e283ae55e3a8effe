"""Projects and their role bindings (which JWT groups or subjects hold which role in a project)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import delete, or_, select, update
from sqlalchemy.orm import Session

from api.core.authz import Role, highest
from api.core.security import new_id
from api.database.tables import Project, RoleBinding
from api.schemas.events import utcnow


def create(session: Session, name: str, gpu_limit: int | None) -> Project:
    row = Project(name=name, gpu_limit=gpu_limit, created_at=utcnow())
    session.add(row)
    session.flush()
    return row


def get(session: Session, name: str, *, for_update: bool = False) -> Project | None:
    query = select(Project).where(Project.name == name)
    return session.scalar(query.with_for_update() if for_update else query)


def lock(session: Session, name: str) -> Project | None:
    """The project's row, locked against every other locker until the transaction ends. A write that changes
    nothing takes the lock on both databases: a row lock on PostgreSQL, the database's write lock on SQLite
    (which has no SELECT ... FOR UPDATE), so what the transaction reads next is not stale."""
    session.execute(update(Project).where(Project.name == name).values(name=Project.name))
    return session.scalar(select(Project).where(Project.name == name).execution_options(populate_existing=True))


def list_projects(session: Session, names: list[str] | None = None) -> list[Project]:
    """Every project (`names` None), or these."""
    query = select(Project).order_by(Project.name)
    if names is not None:
        query = query.where(Project.name.in_(names))
    return list(session.scalars(query))


def bind(session: Session, project: str, kind: str, value: str, role: Role) -> RoleBinding:
    row = RoleBinding(id=new_id(), project=project, kind=kind, value=value, role=role.value, created_at=utcnow())
    session.add(row)
    session.flush()
    return row


def find_binding(session: Session, project: str, kind: str, value: str) -> RoleBinding | None:
    return session.scalar(
        select(RoleBinding).where(RoleBinding.project == project, RoleBinding.kind == kind, RoleBinding.value == value)
    )


def bindings(session: Session, project: str) -> list[RoleBinding]:
    query = select(RoleBinding).where(RoleBinding.project == project).order_by(RoleBinding.created_at)
    return list(session.scalars(query))


def unbind(session: Session, project: str, binding_id: str) -> bool:
    result = session.execute(delete(RoleBinding).where(RoleBinding.project == project, RoleBinding.id == binding_id))
    return bool(result.rowcount)  # type: ignore[attr-defined]


def roles_of(session: Session, subject: str, groups: Iterable[str]) -> dict[str, Role]:
    """The highest role per project that bindings give this subject and these groups."""
    wanted = [(RoleBinding.kind == "subject") & (RoleBinding.value == subject)]
    group_list = [g for g in groups if isinstance(g, str)]
    if group_list:
        wanted.append((RoleBinding.kind == "group") & RoleBinding.value.in_(group_list))
    found: dict[str, list[Role]] = {}
    for project, name in session.execute(select(RoleBinding.project, RoleBinding.role).where(or_(*wanted))):
        found.setdefault(project, []).append(Role(name))
    return {project: best for project, roles in found.items() if (best := highest(roles)) is not None}
