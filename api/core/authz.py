"""Who may do what: the roles, the caller (`Principal`) and the one rule that compares them.

    viewer         a project's jobs, events, goodput, logs, nodes of its jobs
    operator       + submit, cancel, inject faults, report for its jobs
    admin          + the project's webhooks, tokens and role bindings, its audit log
    cluster-admin  every project as its admin, and the fleet, nodes and projects themselves

A caller holds at most one role per project (a token: the one it was made with; a JWT: the highest its
bindings give). A trainer token holds none: it reports for its own job only (`api/deps.py`).

`access(principal, project, needed)` is the rule: None when allowed, else how to refuse. A caller with no
role in the project is answered as if the object did not exist (404: its existence is not revealed); a
caller whose role is too low is told which role it needs (403). Pure: the routes' dependencies in
`api/deps.py` apply it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

DEFAULT_PROJECT = "default"
CLUSTER_ADMIN = "cluster-admin"
TRAINER = "trainer"
TRAINER_REFUSED = "a trainer token may only report for its own job; use a token with a role in the job's project"


class Role(StrEnum):
    """A role in one project, lowest first."""

    viewer = "viewer"
    operator = "operator"
    admin = "admin"

    @property
    def rank(self) -> int:
        return _RANK[self]

    def covers(self, needed: Role) -> bool:
        return self.rank >= needed.rank


_RANK = {Role.viewer: 1, Role.operator: 2, Role.admin: 3}


def highest(roles: list[Role]) -> Role | None:
    return max(roles, key=lambda r: r.rank) if roles else None


PrincipalKind = Literal["token", "trainer", "jwt", "anonymous"]


@dataclass(frozen=True)
class Principal:
    """Who is calling. `token_id` names the credential (a token's id, or `jwt:<issuer>#<subject>`)."""

    token_id: str
    kind: PrincipalKind = "token"
    name: str = ""
    cluster_admin: bool = False
    roles: Mapping[str, Role] = field(default_factory=dict)
    job_id: str | None = None  # a trainer token's job
    issuer: str | None = None  # a JWT's
    subject: str | None = None  # a JWT's
    expires_at: datetime | None = None  # a JWT's

    @property
    def is_trainer(self) -> bool:
        return self.kind == "trainer"

    def role_in(self, project: str) -> Role | None:
        """The caller's role in `project` (a cluster admin is every project's admin)."""
        if self.cluster_admin:
            return Role.admin
        return self.roles.get(project)

    def projects(self, needed: Role = Role.viewer) -> list[str] | None:
        """The projects where the caller holds `needed` or more; None: every project (a cluster admin)."""
        if self.cluster_admin:
            return None
        return sorted(p for p, role in self.roles.items() if role.covers(needed))

    @property
    def label(self) -> str:
        """How the audit log and messages name the caller."""
        if self.kind == "jwt":
            return f"{self.subject} ({self.issuer})"
        return f"{self.name or self.kind} ({self.token_id})"


ANONYMOUS = Principal(token_id="auth-disabled", kind="anonymous", name="anonymous", cluster_admin=True)


@dataclass(frozen=True)
class Refusal:
    status: Literal[403, 404]
    message: str


def access(principal: Principal, project: str, needed: Role, what: str) -> Refusal | None:
    """None when `principal` holds `needed` in `project`; else a 404 (no role there: `what` is reported as not
    found) or a 403 naming the role needed. `what` names the object, e.g. "job 'ab12'"."""
    if principal.is_trainer:
        return Refusal(403, TRAINER_REFUSED)
    held = principal.role_in(project)
    if held is None:
        return Refusal(404, f"no {what}")
    if not held.covers(needed):
        return Refusal(
            403,
            f"this needs the {needed.value} role in project {project!r}; {principal.label} holds {held.value}: "
            f"ask an admin of the project for a token or binding with {needed.value}",
        )
    return None


def cluster_admin_refusal(principal: Principal) -> Refusal | None:
    if principal.cluster_admin:
        return None
    if principal.is_trainer:
        return Refusal(403, "a trainer token may only report for its own job; this needs the cluster-admin role")
    return Refusal(403, f"this needs the {CLUSTER_ADMIN} role; {principal.label} has roles in projects only")


def report_refusal(principal: Principal, job_id: str, project: str | None) -> Refusal | None:
    """Who may report for a job: its own trainer token, or an operator of its project (`project` None: no such
    job)."""
    if principal.job_id == job_id:
        return None
    if principal.is_trainer:
        return Refusal(403, "this token belongs to another job")
    what = f"job with id {job_id!r}"
    if project is None:
        return Refusal(404, f"no {what}")
    return access(principal, project, Role.operator, what)
