"""deploy/'s RBAC: the Role and ClusterRole grant exactly what the backend asks of the API over a job's life (with
node remediation, what its component adds), bound to the workers' service account."""

from __future__ import annotations

from typing import Any

from tests.fake_kubernetes import FakeKube
from tests.workers.backends.kubernetes.deploy_files import KUSTOMIZE, by_kind, load_docs
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, backend_for, make_request, make_spec, validate_strict
from workers.backends.kubernetes import manifests as m


def rules_of(docs: list[dict[str, Any]], kind: str) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for doc in docs
        if doc["kind"] == kind
        for rule in doc["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def verb_of(method: str, path: str, query: dict[str, list[str]] | None = None) -> tuple[str, str, str, bool]:
    """(API group, resource, verb, namespaced) of a request."""
    parts = path.strip("/").split("/")
    group, rest = (parts[1], parts[3:]) if parts[0] == "apis" else ("", parts[2:])
    namespaced = rest[0] == "namespaces"
    if namespaced:
        rest = rest[2:]
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    verb = {
        "GET": "get" if named else "list",
        "POST": "create",
        "PUT": "update",
        "PATCH": "patch",
        "DELETE": "delete" if named else "deletecollection",
    }[method]
    if (query or {}).get("watch") == ["true"]:
        verb = "watch"
    return group, resource, verb, namespaced


def backend_requests(unhealthy_nodes: str = "off") -> list[tuple[str, str, str, bool]]:
    """What the backend asks of the API over a job's life: launches, status while pending, queued and running,
    a lost node, cancel, cleanup."""
    fake = FakeKube().start()
    try:
        backend = backend_for(fake, unhealthy_nodes=unhealthy_nodes)
        request = make_request()
        spec = request.spec
        name = m.attempt_name(JOB_ID, spec.name, 0)
        backend.launch(request)
        backend.launch(request)  # 409s: the attempt is there
        backend.status(JOB_ID, 0, spec)  # pending: reads Events too
        fake.schedule(name, "training")
        fake.run(name, "training")
        backend.status(JOB_ID, 0, spec)  # running: reads node health
        fake.not_ready(fake.pod(name, "training", 1)["spec"]["nodeName"])
        backend.status(JOB_ID, 0, spec)
        backend.cancel(JOB_ID, 0, spec)
        queued = make_request(make_spec(queue="team-a"), attempt=1, excluded=("ip-10-0-1-2",))
        backend.launch(queued)
        backend.status(JOB_ID, 1, queued.spec)  # reads its Kueue Workload
        backend.delete_job_resources(JOB_ID, spec)
        backend.close()
        # API discovery (/apis) is every authenticated caller's (the system:discovery ClusterRole): no rule needed
        resources = [r for r in fake.requests if r.path.rstrip("/") not in ("/apis", "/apis/kueue.x-k8s.io")]
        assert len(resources) < len(fake.requests), "the backend discovers Kueue's served versions"
        return [verb_of(r.method, r.path, r.query) for r in resources]
    finally:
        fake.stop()


def test_the_roles_grant_exactly_what_the_backend_uses():
    docs = load_docs(KUSTOMIZE / "base/rbac.yaml")
    used = backend_requests()
    in_namespace = {(g, r, v) for g, r, v, namespaced in used if namespaced}
    cluster_wide = {(g, r, v) for g, r, v, namespaced in used if not namespaced}
    assert in_namespace == rules_of(docs, "Role"), "the Role and the backend disagree"
    assert cluster_wide == rules_of(docs, "ClusterRole") == {("", "nodes", "list"), ("", "nodes", "get")}
    # Secrets: created only; never read, listed, changed or deleted (nothing else of the namespace is exposed)
    assert {(r, v) for _, r, v in rules_of(docs, "Role") if r == "secrets"} == {("secrets", "create")}


def test_node_remediation_uses_only_what_its_component_grants():
    used = {(g, r, v) for g, r, v, namespaced in backend_requests("taint") if not namespaced}
    component = load_docs(KUSTOMIZE / "components/node-remediation/rbac.yaml")
    base = load_docs(KUSTOMIZE / "base/rbac.yaml")
    assert used == rules_of(component, "ClusterRole") | rules_of(base, "ClusterRole")


def test_role_is_bound_to_the_workers_service_account_in_the_job_namespace():
    docs = load_docs(KUSTOMIZE / "base/rbac.yaml")
    role = by_kind(docs, "Role")["ftplane-jobs"]
    binding = by_kind(docs, "RoleBinding")["ftplane-jobs"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "training"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "ftplane-jobs",
    }
    worker = {"kind": "ServiceAccount", "name": "ftplane-worker", "namespace": "ftplane"}
    assert binding["subjects"] == [worker]
    for doc in docs:
        validate_strict(doc)
