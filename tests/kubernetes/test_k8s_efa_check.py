"""deploy/docker/efa-check.sh, the trainer image's entrypoint and the EFA pods' init container, run for real against
a made-up filesystem: with EFA asked for, a pod whose image has no loadable OFI plugin fails with 78 (NCCL would
have fallen back to TCP sockets without a word), one on a node without EFA devices or provider with 94."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "deploy/docker/efa-check.sh"


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
    return tmp_path


def check(root: Path, *command: str, expected: str | None = "1") -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{root / 'bin'}:{os.environ['PATH']}", "FTPLANE_EFA_ROOT": str(root)}
    if expected is not None:
        env["FTPLANE_EFA_EXPECTED"] = expected
    return subprocess.run(["sh", str(SCRIPT), *command], env=env, capture_output=True, text=True, timeout=30)


def test_all_good_runs_the_command(node):
    done = check(node, "sh", "-c", "echo training")
    assert done.returncode == 0 and done.stdout.splitlines() == [
        f"ftplane-efa-check: EFA ready (4 devices, {node}/opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so)",
        "training",
    ]


def no_plugin(node: Path) -> None:
    (node / "opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so").unlink()


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
        (no_plugin, 78, "the aws-ofi-nccl plugin (libnccl-net*.so) is not in the image"),
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
