"""Faults the backend delivers itself (node_loss, crash, hang), through the real client against the fake."""

from __future__ import annotations

import pytest

from api.schemas.causes import CauseClass
from tests.kubernetes.k8s_support import (
    A0,
    JOB_ID,
    NS,
    SPEC,
    make_request,
    option,
    running_attempt,
)
from workers.backends.base import AttemptPhase, FaultNotSupported, FaultRequest
from workers.backends.kubernetes import KubernetesBackendError


def test_node_loss_fault_deletes_the_pod_of_the_ranks_node(fake, backend):
    running_attempt(fake, backend)
    victim = fake.pod(A0, NS, 1)
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f1", kind="node_loss", rank=9))
    (delete,) = [r for r in fake.requests if r.method == "DELETE"]
    assert delete.path.endswith("/pods/" + victim["metadata"]["name"])
    assert option(delete, "gracePeriodSeconds") == "0"
    assert fake.get("pods", NS, victim["metadata"]["name"]) is None
    status = backend.status(JOB_ID, 0, SPEC)
    assert status.phase == AttemptPhase.failed
    assert status.failed_nodes == (victim["spec"]["nodeName"],)
    assert "injected node_loss" in status.cause.message
    assert status.cause.cause_class == CauseClass.node


@pytest.mark.parametrize(("kind", "signal"), [("crash", "KILL"), ("hang", "STOP")])
def test_crash_and_hang_signal_the_rank_through_exec(fake, backend, kind, signal):
    running_attempt(fake, backend)
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind=kind, rank=10))
    assert fake.signals == [(fake.pod(A0, NS, 1)["metadata"]["name"], 10, signal)]
    exec_calls = [r for r in fake.requests if r.path.endswith("/exec")]
    assert len(exec_calls) == 1
    assert exec_calls[0].query["command"][:2] == ["sh", "-c"]
    assert exec_calls[0].query["container"] == ["trainer"]


def test_exec_searches_the_other_pods_when_the_rank_is_elsewhere(fake, backend):
    request = make_request()
    backend.launch(request)
    fake.schedule(A0, NS)
    fake.run(A0, NS, rank_layout=lambda index, ppn: [(1 - index) * ppn + i for i in range(ppn)])  # swapped
    backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="crash", rank=3))
    assert fake.signals == [(fake.pod(A0, NS, 1)["metadata"]["name"], 3, "KILL")]
    assert len([r for r in fake.requests if r.path.endswith("/exec")]) == 2


def test_exception_faults_belong_to_the_trainer(backend):
    with pytest.raises(FaultNotSupported):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="exception", rank=1))


def test_fault_into_an_attempt_without_pods_is_a_clear_error(fake, backend):
    with pytest.raises(KubernetesBackendError, match="no running pod"):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="hang", rank=1))
    with pytest.raises(KubernetesBackendError, match="no live pod for rank 1"):
        backend.inject_fault(JOB_ID, 0, SPEC, FaultRequest(id="f", kind="node_loss", rank=1))
