"""deploy/docker/efa-check.sh, the trainer image's entrypoint and the EFA pods' init container, run for real against
a made-up filesystem: with EFA asked for, a pod whose NCCL would load no plugin, another plugin than aws-ofi-nccl
(finding 7: NGC's images carry their own libnccl-net.so, and the check only looked for a file), or one that
cannot load or is not linked to libfabric fails with 78 (NCCL would have fallen back to TCP sockets without a
word); one on a node without EFA devices or provider with 94."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

SCRIPT = REPO / "deploy/docker/efa-check.sh"


def tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node with EFA devices and an image with the OFI plugin, libfabric seeing the EFA provider."""
    (tmp_path / "dev/infiniband").mkdir(parents=True)
    for i in range(4):
        (tmp_path / f"dev/infiniband/uverbs{i}").touch()
    (tmp_path / "opt/amazon/ofi-nccl/lib").mkdir(parents=True)
    (tmp_path / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so").touch()
    (tmp_path / "bin").mkdir()
    tool(tmp_path / "bin", "fi_info", "exit 0")
    tool(tmp_path / "bin", "ldd", 'echo "libfabric.so.1 => /opt/amazon/efa/lib/libfabric.so.1"')
    tool(tmp_path / "bin", "ldconfig", "exit 0")  # an empty linker cache: only LD_LIBRARY_PATH finds plugins
    return tmp_path


IMAGE_ENV = {"NCCL_NET_PLUGIN": "ofi", "LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"}


def check(root: Path, *command: str, expected: str | None = "1", **image_env: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{root / 'bin'}:{os.environ['PATH']}", "FTPLANE_EFA_ROOT": str(root), **IMAGE_ENV, **image_env}
    if expected is not None:
        env["FTPLANE_EFA_EXPECTED"] = expected
    return subprocess.run(["sh", str(SCRIPT), *command], env=env, capture_output=True, text=True, timeout=30)


def test_all_good_runs_the_command(node):
    done = check(node, "sh", "-c", "echo training")
    assert done.returncode == 0 and done.stdout.splitlines() == [
        f"ftplane-efa-check: EFA ready (4 devices, NCCL loads {node}/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so)",
        "training",
    ]


def no_plugin(node: Path) -> None:
    (node / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so").unlink()


def not_linked_to_libfabric(node: Path) -> None:
    tool(node / "bin", "ldd", 'echo "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6"')


def plugin_cannot_load(node: Path) -> None:
    tool(node / "bin", "ldd", 'echo "libfabric.so.1 => not found"')


def no_device(node: Path) -> None:
    for dev in (node / "dev/infiniband").iterdir():
        dev.unlink()


def no_provider(node: Path) -> None:
    tool(node / "bin", "fi_info", "exit 61")


@pytest.mark.parametrize(
    ("broken", "code", "words"),
    [
        (no_plugin, 78, "NCCL would load no network plugin (NCCL_NET_PLUGIN=ofi"),
        (not_linked_to_libfabric, 78, "is not linked to libfabric"),
        (plugin_cannot_load, 78, "cannot be loaded (missing: libfabric.so.1 => not found)"),
        (no_device, 94, "no EFA device"),
        (no_provider, 94, "libfabric finds no EFA provider"),
    ],
)
def test_what_is_broken_decides_the_exit_status(node, broken, code, words):
    broken(node)
    done = check(node, "sh", "-c", "echo training")
    assert done.returncode == code and words in done.stderr
    assert "training" not in done.stdout  # the command never starts


def test_nothing_is_checked_when_efa_is_neither_asked_for_nor_present(tmp_path):
    done = check(tmp_path, "echo", "cpu job", expected=None)
    assert done.returncode == 0 and done.stdout == "cpu job\n"
    assert check(tmp_path, expected=None).returncode == 0  # as an init container: no command


def test_a_plugin_of_the_base_image_that_nccl_would_load_first_is_refused(node):
    """NGC's PyTorch image puts HPC-X's SHARP plugin, a libnccl-net.so, on the library path: with NCCL_NET_PLUGIN
    unset NCCL loads it, not the OFI plugin, and uses no EFA although the OFI plugin is in the image."""
    sharp = node / "opt/hpcx/nccl_rdma_sharp_plugin/lib"
    sharp.mkdir(parents=True)
    (sharp / "libnccl-net.so").touch()
    (node / "opt/amazon/ofi-nccl/lib/libnccl-net.so").symlink_to("libnccl-net-ofi.so")
    path = "/opt/hpcx/nccl_rdma_sharp_plugin/lib:/opt/amazon/ofi-nccl/lib"
    done = check(node, "echo", "training", NCCL_NET_PLUGIN="", LD_LIBRARY_PATH=path)
    assert done.returncode == 78 and "not the aws-ofi-nccl plugin" in done.stderr and "nccl_rdma_sharp" in done.stderr
    named = check(node, "echo", "training", LD_LIBRARY_PATH=path)  # NCCL_NET_PLUGIN=ofi, as the image sets it
    assert named.returncode == 0 and "NCCL loads" in named.stdout and named.stdout.endswith("training\n")


def test_the_init_container_checks_with_the_trainers_network_variables():
    from tests.workers.backends.kubernetes.k8s_support import make_request, make_spec
    from workers.backends.kubernetes import manifests as m

    spec = make_spec(env={"NCCL_NET_PLUGIN": "aws-ofi", "NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"})
    (init,) = m.job_manifest(make_request(spec))["spec"]["template"]["spec"]["initContainers"]
    env = {e["name"]: e["value"] for e in init["env"]}
    assert env["FTPLANE_EFA_EXPECTED"] == "1" and env["FI_PROVIDER"] == "efa"
    assert env["NCCL_NET_PLUGIN"] == "aws-ofi" and env["NCCL_DEBUG"] == "INFO"  # the spec's own win, as in the trainer
    assert "OMP_NUM_THREADS" not in env
    trainer = {
        e["name"]: e.get("value")
        for e in m.job_manifest(make_request(make_spec()))["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert trainer["NCCL_NET_PLUGIN"] == "ofi"
