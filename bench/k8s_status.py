"""One status pass of the Kubernetes backend over a 2,048-pod job: bytes read and worker CPU, before and after.

    python -m bench.k8s_status [--pods 2048] [--passes 15] [--node-images 40] [--pod-padding 3000]

The fake API of tests/fake_kubernetes, in a process of its own (as an API server is), serves `--pods` GPU nodes
and one attempt of a job with that many nodes: the product's `KubernetesBackend.launch` creates it, then every
pod is bound to its own node and started. Objects are padded towards the sizes of a real EKS cluster: each Node gets
`--node-images` container images in its status (an EKS GPU node lists dozens), each pod a managedFields entry of
`--pod-padding` bytes (what server-side apply and the kubelet add). The backend (the product's class, through the
real `kubernetes` client over HTTP) then reads the attempt's status `--passes` times per case, in two ways in the
same run:

- before: as the backend read until this change: the whole pod list every pass (`pod_reads="list"`), and, when
  something is off, the Job's Events and eight pods' every pass (an `EventReader` allowed nine lists a pass and
  keeping nothing);
- after: the product's defaults: pods listed once and then watched, Events only for the pods whose status does
  not say why, at most three lists a pass, each kept 15 s.

Cases: steady (all Running and Ready, no page of nodes due); a page of nodes (the next 256 Node objects read in
the pass); a node lost (one node NotReady, its pod not Ready: its Node is read by name, and Events as each
backend decides). Figures per case and way: CPU seconds of the benchmark's process per `status()` call
(`time.process_time`, every thread: the HTTP client, JSON decoding, the watch thread, the interpretation: what a
worker spends; the fake API is another process), bytes the API answered per pass (the fake counts every answer,
the watch's stream included), API requests per pass, Event lists per pass and the bytes of Events "etcd" read for
them (no watch cache for Events: every list reads the namespace's). Median and worst CPU over the passes (each
case after one pass not counted: the first read lists, and the client's first use of an API builds what it needs).
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
from tests.workers.backends.kubernetes.k8s_support import make_request, make_spec
from workers.backends.base import AttemptPhase
from workers.backends.kubernetes import KubernetesBackend, RetryPolicy
from workers.backends.kubernetes import manifests as m
from workers.backends.kubernetes.events import EventReader

JOB_ID = "bench-k8s-status"
NS = "training"


def build(pods: int, node_images: int, pod_padding: int) -> tuple[FakeKube, Any, str]:
    """The fake cluster with a running job of `pods` pods, one per node."""
    fake = FakeKube(nodes=[f"ip-10-{i // 250}-{i % 250}-1.us-west-2.compute.internal" for i in range(pods)]).start()
    for node_name in fake.nodes:
        node = fake.node(node_name)
        node["status"]["images"] = [
            {"names": [f"123456789012.dkr.ecr.us-west-2.amazonaws.com/image-{j}@sha256:{'0' * 64}"], "sizeBytes": 10**9}
            for j in range(node_images)
        ]
    spec = make_spec(nodes=pods)
    KubernetesBackend(fake.api_client()).launch(make_request(spec, job_id=JOB_ID))
    name = m.attempt_name(JOB_ID, spec.name, 0)
    ts = fake.ts()
    for pod, node_name in zip(fake.pods(name, NS), fake.nodes, strict=True):
        pod["spec"]["nodeName"] = node_name
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
        elif what == "recover":  # the node is back, its pod Ready again: the next way starts steady
            pod = fake.pod(name, NS, 0)
            fake.ready(pod["spec"]["nodeName"])
            ready = {"type": "Ready", "status": "True", "lastTransitionTime": fake.ts()}
            pod["status"]["conditions"] = [c for c in pod["status"]["conditions"] if c["type"] != "Ready"] + [ready]
            pod["metadata"]["resourceVersion"] = str(next(fake.rv))
        served = sum(r.bytes for r in fake.requests)
        conn.send((len(fake.requests), served, fake.event_lists, fake.event_bytes_scanned))
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

    def backend(way: str, node_refresh_s: float) -> KubernetesBackend:
        made = KubernetesBackend(
            client(ready["url"]),
            retry=retry,
            request_timeout=(5.0, 300.0),
            node_refresh_s=node_refresh_s,
            pod_reads="list" if way == "before" else "watch",
        )
        if way == "before":  # the Job's and eight pods' Events every pass, nothing kept
            made.events = EventReader(made.api, lists_per_pass=9, refresh_s=0.0)
        return made

    try:
        for way in ("before", "after"):
            steady, fresh = backend(way, 1e9), backend(way, 0.0)
            assert steady.status(JOB_ID, 0, spec).phase == AttemptPhase.running  # its first (only) page of nodes
            cases: list[tuple[str, KubernetesBackend, str]] = [
                ("steady", steady, "count"),
                ("a page of nodes", fresh, "count"),
                ("a node lost", steady, "lose a node"),
            ]
            for case, used, prepare in cases:
                conn.send(prepare)
                conn.recv()
                used.status(JOB_ID, 0, spec)  # one pass first, not counted
                conn.send("count")
                before = conn.recv()

                def one_pass(b: KubernetesBackend = used) -> None:
                    b.status(JOB_ID, 0, spec)

                cpu, wall = measure(one_pass, args.passes)
                conn.send("count")
                after = conn.recv()
                per_pass = [(a - b) / args.passes for a, b in zip(after, before, strict=True)]
                results[f"{case} ({way})"] = {
                    "cpu": cpu,
                    "wall": wall,
                    "requests": per_pass[0],
                    "bytes": per_pass[1],
                    "event_lists": per_pass[2],
                    "event_bytes_scanned": per_pass[3],
                }
            conn.send("recover")
            conn.recv()
            steady.close()
            fresh.close()
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
            f"{r['bytes'] / 2**20:.2f}",
            f"{r['requests']:.1f}",
            f"{r['event_lists']:.1f}",
            f"{r['event_bytes_scanned'] / 2**10:.0f}",
        ]
        for case, r in results.items()
    ]
    print(f"machine: {machine()}")
    print(
        f"{args.pods} pods on {args.pods} nodes; pod list {pods_bytes / 2**20:.1f} MiB, node list "
        f"{nodes_bytes / 2**20:.1f} MiB; {args.passes} passes per case; setup {setup_s:.0f} s"
    )
    print(
        table(
            [
                "case",
                "worker CPU s (median)",
                "worker CPU s (worst)",
                "wall s (median)",
                "MiB read/pass",
                "API requests/pass",
                "Event lists/pass",
                "Event KiB etcd read/pass",
            ],
            rows,
        )
    )
    for case in ("steady", "a page of nodes", "a node lost"):
        old, new = results[f"{case} (before)"], results[f"{case} (after)"]
        cpu = statistics.median(old["cpu"]) / max(statistics.median(new["cpu"]), 1e-9)
        read = old["bytes"] / max(new["bytes"], 1.0)
        print(f"{case}: before/after worker CPU (median) {cpu:.1f}x, bytes read {read:.0f}x")
    return {"results": results, "pods_bytes": pods_bytes, "nodes_bytes": nodes_bytes}


if __name__ == "__main__":
    main()
