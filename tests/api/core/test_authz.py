"""The one authorization rule (`api/core/authz.py`), over every role held against every role needed."""

from __future__ import annotations

import itertools

import pytest

from api.core.authz import ANONYMOUS, Principal, Role, access, cluster_admin_refusal, report_refusal

ROLES = list(Role)


@pytest.mark.parametrize(("held", "needed"), list(itertools.product(ROLES, ROLES)))
def test_a_role_covers_the_roles_below_it_and_names_the_one_needed(held: Role, needed: Role) -> None:
    caller = Principal(token_id="t", name="ci", roles={"a": held})
    refusal = access(caller, "a", needed, "job 'x'")
    if ROLES.index(held) >= ROLES.index(needed):
        assert refusal is None
    else:
        assert refusal is not None and refusal.status == 403
        assert f"the {needed.value} role in project 'a'" in refusal.message and held.value in refusal.message
    elsewhere = access(caller, "b", needed, "job 'x'")  # no role there: as if it did not exist
    assert elsewhere is not None and (elsewhere.status, elsewhere.message) == (404, "no job 'x'")


def test_cluster_admins_hold_admin_everywhere_and_trainers_nothing() -> None:
    root = Principal(token_id="r", cluster_admin=True)
    trainer = Principal(token_id="t", kind="trainer", job_id="j1")
    for role in ROLES:
        assert access(root, "any", role, "x") is None and access(ANONYMOUS, "any", role, "x") is None
        refused = access(trainer, "any", role, "x")
        assert refused is not None and refused.status == 403
    assert root.projects() is None and cluster_admin_refusal(root) is None
    member = Principal(token_id="m", roles={"a": Role.viewer, "b": Role.admin})
    assert member.projects() == ["a", "b"] and member.projects(Role.admin) == ["b"]
    assert cluster_admin_refusal(member) is not None and cluster_admin_refusal(trainer) is not None


def test_who_may_report_for_a_job() -> None:
    own = Principal(token_id="t", kind="trainer", job_id="j1")
    assert report_refusal(own, "j1", None) is None
    other = report_refusal(own, "j2", "a")
    assert other is not None and other.status == 403
    operator = Principal(token_id="o", roles={"a": Role.operator})
    viewer = Principal(token_id="v", roles={"a": Role.viewer})
    assert report_refusal(operator, "j2", "a") is None
    refused = report_refusal(viewer, "j2", "a")
    assert refused is not None and refused.status == 403 and "operator" in refused.message
    missing = report_refusal(operator, "j3", None)
    assert missing is not None and missing.status == 404
