"""One status pass of the Kubernetes backend over a 2,048-pod job, in worker CPU.

    python -m bench.k8s_status [--pods 2048] [--passes 15] [--node-images 40] [--pod-padding 3000]

The fake API of tests/fake_kubernetes, in a process of its own (as an API server is), serves `--pods` GPU nodes
and one attempt of a job with that many nodes: the product's `KubernetesBackend.launch` creates it, then every
pod is bound to its own node and started. Objects are padded towards the sizes of a real EKS cluster: each Node gets
`--node-images` container images in its status (an EKS GPU node lists dozens), each pod a managedFields entry of
`--pod-padding` bytes (what server-side apply and the kubelet add). The backend (the product's class, through the
real `kubernetes` client over HTTP) then reads the attempt's status `--passes` times per case:

- steady: every pod Running and Ready, no page of nodes due (one is read at most every 2 s per node selector);
- a page of nodes: the same, with the next page of 256 Node objects read in the pass (node_refresh_s 0; a
  2,048-node job's nodes take 8 such pages);
- a node lost: one node NotReady (its pod not Ready): the Job's Events, that pod's Events and its Node (by name)
  are read in the pass.

Figures per case: CPU seconds of the benchmark's process per `status()` call (`time.process_time`: the HTTP
client, JSON decoding, the interpretation: what a worker spends; the fake API is another process), wall seconds
(the fake's own serialisation included), API requests per pass and the size of the pod and node lists. Median
and worst over the passes (each case after one pass not counted: the client's first use of an API imports and
builds what it needs once per process). Target: under 1 s of worker CPU per pass over 2,048 pods.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from kubernetes import client as k8s_client

from bench.common import machine, table
from tests.fake_kubernetes import FakeKube
from tests.kubernetes.k8s_support import make_request, make_spec
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import KubernetesBackend, RetryPolicy
from workers.backends.kubernetes import manifests as m

JOB_ID = "bench-k8s-status"
NS = "training"


def build(pods: int, node_images: int, pod_padding: int) -> tuple[FakeKube, Any, str]:
    """The fake cluster with a running job of `pods` pods, one per node."""
    fake = FakeKube(nodes=[f"ip-10-{i // 250}-{i % 250}-1.us-west-2.compute.internal" for i in range(pods)]).start()
    for name in fake.nodes:
        node = fake.node(name)
        node["status"]["images"] = [
            {"names": [f"123456789012.dkr.ecr.us-west-2.amazonaws.com/image-{j}@sha256:{'0' * 64}"], "sizeBytes": 10**9}
            for j in range(node_images)
        ]
    spec = make_spec(nodes=pods)
    KubernetesBackend(fake.api_client()).launch(make_request(spec, job_id=JOB_ID))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    ts = fake.ts()
    for pod, node in zip(fake.pods(name, NS), fake.nodes, strict=True):
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": ts}]
        pod["metadata"]["managedFields"] = [
            {
                "manager": "kubelet",
                "operation": "Update",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:status": "x" * pod_padding},
            }
        ]
    fake.run(name, NS)
    return fake, spec, name


def serve(conn: Connection, pods: int, node_images: int, pod_padding: int) -> None:
    """The fake API's process: build the cluster, then do what the benchmark asks until it says stop."""
    fake, _, name = build(pods, node_images, pod_padding)
    pods_bytes = len(json.dumps({"items": fake.list("pods", NS, m.attempt_selector(JOB_ID, 0))}))
    nodes_bytes = len(json.dumps({"items": fake.list("nodes")}))
    conn.send({"url": fake.url, "pods_bytes": pods_bytes, "nodes_bytes": nodes_bytes})
    while True:
        what = conn.recv()
        if what == "stop":
            break
        if what == "lose a node":
            fake.not_ready(fake.pod(name, NS, 0)["spec"]["nodeName"])
        conn.send(len(fake.requests))
    fake.stop()


def measure(call: Callable[[], Any], passes: int) -> tuple[list[float], list[float]]:
    cpu, wall = [], []
    for _ in range(passes):
        t0, w0 = time.process_time(), time.perf_counter()
        call()
        cpu.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
    return cpu, wall


def client(url: str) -> k8s_client.ApiClient:
    cfg = k8s_client.Configuration(host=url)
    cfg.retries = False
    return k8s_client.ApiClient(cfg)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=2048)
    parser.add_argument("--passes", type=int, default=15)
    parser.add_argument("--node-images", type=int, default=40)
    parser.add_argument("--pod-padding", type=int, default=3000)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    conn, child_conn = multiprocessing.Pipe()
    server = multiprocessing.get_context("spawn").Process(
        target=serve, args=(child_conn, args.pods, args.node_images, args.pod_padding), daemon=True
    )
    server.start()
    ready = conn.recv()
    setup_s = time.perf_counter() - started
    spec = make_spec(nodes=args.pods)
    retry = RetryPolicy(attempts=2, base_wait_s=0.01)
    results: dict[str, Any] = {}
    try:
        steady = KubernetesBackend(client(ready["url"]), retry=retry, request_timeout=(5.0, 300.0), node_refresh_s=1e9)
        fresh = KubernetesBackend(client(ready["url"]), retry=retry, request_timeout=(5.0, 300.0), node_refresh_s=0.0)
        assert steady.status(JOB_ID, 0, spec).phase == AttemptPhase.running  # reads its first (only) page of nodes
        cases: list[tuple[str, KubernetesBackend, str]] = [
            ("steady", steady, "count"),
            ("a page of nodes", fresh, "count"),
            ("a node lost", steady, "lose a node"),
        ]
        for case, backend, prepare in cases:
            conn.send(prepare)
            conn.recv()
            backend.status(JOB_ID, 0, spec)  # one pass first, not counted: the client's first use of an API
            conn.send("count")
            before = conn.recv()
            cpu, wall = measure(lambda b=backend: b.status(JOB_ID, 0, spec), args.passes)
            conn.send("count")
            requests = (conn.recv() - before) / args.passes
            results[case] = {"cpu": cpu, "wall": wall, "requests": requests}
    finally:
        conn.send("stop")
        server.join(timeout=30)
    pods_bytes, nodes_bytes = ready["pods_bytes"], ready["nodes_bytes"]

    rows = [
        [
            case,
            f"{statistics.median(r['cpu']):.3f}",
            f"{max(r['cpu']):.3f}",
            f"{statistics.median(r['wall']):.3f}",
            f"{r['requests']:.0f}",
        ]
        for case, r in results.items()
    ]
    print(f"machine: {machine()}")
    print(
        f"{args.pods} pods on {args.pods} nodes; pod list {pods_bytes / 2**20:.1f} MiB, node list "
        f"{nodes_bytes / 2**20:.1f} MiB; {args.passes} passes per case; setup {setup_s:.0f} s"
    )
    print(
        table(["case", "worker CPU s (median)", "worker CPU s (worst)", "wall s (median)", "API requests/pass"], rows)
    )
    worst = max(max(r["cpu"]) for r in results.values())
    print(f"target: < 1 s of worker CPU per pass: {'met' if worst < 1.0 else 'NOT met'} (worst {worst:.3f} s)")
    return {"results": results, "pods_bytes": pods_bytes, "nodes_bytes": nodes_bytes}


if __name__ == "__main__":
    main()
