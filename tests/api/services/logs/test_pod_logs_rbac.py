"""The API's Role (deploy/kustomize/base/rbac-logs.yaml) grants exactly what its pod log reader asks of the API
server, read from the requests the reader makes of the fake API: reading a page, following, a rank, a node."""

from __future__ import annotations

import asyncio

import yaml

from api.services.logs.lines import LogQuery, LogTarget
from api.services.logs.pods import PodLogs
from tests.fake_kubernetes import FakeKube
from tests.support.paths import REPO
from tests.workers.backends.kubernetes.k8s_support import JOB_ID, NS, SPEC, make_request
from tests.workers.backends.kubernetes.test_k8s_rbac import rules_of, verb_of
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes import manifests as m


def test_the_logs_role_grants_exactly_what_the_reader_uses() -> None:
    fake = FakeKube().start()
    try:
        KubernetesBackend(fake.api_client()).launch(make_request())
        name = m.attempt_name(JOB_ID, SPEC.name, 0)
        fake.schedule(name, NS)
        fake.run(name, NS)
        fake.exit(name, NS, 0, 0)  # a follow of pod 0 ends at once
        fake.requests.clear()
        target = LogTarget(JOB_ID, "kubernetes", 0, SPEC.world_size, SPEC.nodes, SPEC.procs_per_node, namespace=NS)
        for query in (LogQuery(0), LogQuery(0, rank=1, tail=5), LogQuery(0, rank=0, follow=True)):
            stream = PodLogs(target, query, fake.api_client()).read()
            assert stream is not None and stream.source == "pod-logs"
            if stream.follow is not None:

                async def drain() -> None:
                    async for _ in stream.follow():  # noqa: B023
                        pass

                asyncio.run(drain())
        used = {verb_of(r.method, r.path) for r in fake.requests}
    finally:
        fake.stop()
    docs = list(yaml.safe_load_all((REPO / "deploy/kustomize/base/rbac-logs.yaml").read_text()))
    assert {(g, r, v) for g, r, v, namespaced in used if namespaced} == rules_of(docs, "Role")
    assert rules_of(docs, "Role") == {("", "pods", "list"), ("", "pods/log", "get")}
    assert not [u for u in used if not u[3]]  # nothing cluster-wide
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ftplane-api", "namespace": "ftplane"}]
    assert binding["metadata"]["namespace"] == "training"
