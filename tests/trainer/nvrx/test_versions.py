"""The NVRx version the trainer expects on CUDA, and the guard around NVRx's private attributes: they
are touched only on the versions whose source they were read in; elsewhere a public call or nothing.

No GPU needed: the saver is built around a stand-in queue (its constructor needs CUDA). On the GPU
machine the same tests run against NVRx 0.7 (bench/gpu_setup.sh)."""

from __future__ import annotations

import logging
import re
import threading
import tomllib
from typing import Any

import pytest
from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

from ftplane.trainer.nvrx import async_checkpoint, versions
from tests.support.paths import REPO


@pytest.mark.parametrize(
    ("version", "read"),
    [("0.4.1", True), ("0.7.0", True), ("0.7.3", True), ("0.5.0", False), ("0.8.0", False), ("0.4.2", False)],
)
def test_private_attributes_only_on_the_versions_read(version: str, read: bool) -> None:
    assert versions.internals_read(version) is read


def test_an_unknown_or_unparsable_version_is_not_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "NVRX_VERSION", None)
    assert not versions.internals_read() and not versions.nvrx_version_matches(versions.NVRX_FOR_CUDA)
    assert not versions.internals_read("a source checkout")


def test_the_gpu_extra_pins_the_nvrx_the_cuda_path_expects() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    [pin] = [re.sub(r"\s+", "", r) for r in extras["gpu"] if r.startswith("nvidia-resiliency-ext")]
    assert pin == "nvidia-resiliency-ext" + versions.NVRX_FOR_CUDA
    assert versions.nvrx_version_matches(versions.NVRX_FOR_CUDA, "0.7.0")
    assert not versions.nvrx_version_matches(versions.NVRX_FOR_CUDA, "0.4.1")  # the CPU pin (Makefile)


class OldQueue:
    """NVRx 0.4.1's AsyncCallsQueue as the saver uses it: `close()` takes no `abort`."""

    def __init__(self) -> None:
        self.async_calls: list[Any] = ["an unfinalized save"]
        self.persistent_caller = self.Caller()
        self.closed = False
        self.finalized = 0

    class Caller:
        closed = False

        def close(self) -> None:
            self.closed = True

    def close(self) -> None:
        self.closed = True

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> list[int]:
        self.finalized += 1
        return []

    def get_num_unfinalized_calls(self) -> int:
        return len(self.async_calls)


class NewQueue(OldQueue):
    """NVRx 0.7's: `close(abort=True)` stops the writer without finalizing."""

    def close(self, abort: bool = False) -> None:  # type: ignore[override]
        self.closed = True
        self.aborted = abort


def saver_with(queue: OldQueue) -> async_checkpoint.NvrxAsyncSaver:
    saver = object.__new__(async_checkpoint.NvrxAsyncSaver)
    saver.queue = queue  # type: ignore[assignment]
    saver._abandoned = False
    return saver


def test_abandon_takes_the_public_abort_where_nvrx_has_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "NVRX_VERSION", "0.9.0")  # not a version whose internals were read
    queue = NewQueue()
    saver = saver_with(queue)
    saver.abandon()
    assert queue.closed and queue.aborted
    assert queue.async_calls and not queue.persistent_caller.closed  # no private attribute touched
    # Nothing more is finalized by this saver (a finalize would mark the abandoned save complete).
    saver.poll(blocking=True)
    saver.close()
    assert saver.in_flight == 0 and queue.finalized == 0


def test_abandon_uses_private_attributes_only_on_a_version_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "NVRX_VERSION", "0.4.1")
    queue = OldQueue()
    saver_with(queue).abandon()
    assert queue.async_calls == [] and queue.persistent_caller.closed and not queue.closed


def test_abandon_on_an_unread_version_touches_nothing_private(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(versions, "NVRX_VERSION", "0.5.0")
    queue = OldQueue()
    saver = saver_with(queue)
    with caplog.at_level(logging.WARNING, logger=async_checkpoint.__name__):
        saver.abandon()
    assert queue.async_calls == ["an unfinalized save"] and not queue.persistent_caller.closed
    assert not queue.closed  # a plain close() would finalize: a collective with peers that may be gone
    assert "0.5.0" in caplog.text and "never marked complete" in caplog.text
    saver.poll()
    assert queue.finalized == 0


@pytest.mark.parametrize(("version", "called"), [("0.4.1", True), ("0.6.0", False)])
def test_the_results_queue_private_maker_only_on_a_version_read(
    monkeypatch: pytest.MonkeyPatch, version: str, called: bool
) -> None:
    made = threading.Event()
    monkeypatch.setattr(versions, "NVRX_VERSION", version)
    monkeypatch.delattr(filesystem_async, "get_write_results_queue", raising=False)
    monkeypatch.setattr(filesystem_async, "_get_write_results_queue", made.set, raising=False)
    thread = async_checkpoint._start_results_queue()
    if thread is not None:
        thread.join(5)
    assert made.is_set() is called and (thread is not None) is called


def test_the_results_queue_public_maker_on_any_version(monkeypatch: pytest.MonkeyPatch) -> None:
    made = threading.Event()
    monkeypatch.setattr(versions, "NVRX_VERSION", "0.9.0")
    monkeypatch.setattr(filesystem_async, "get_write_results_queue", made.set, raising=False)
    thread = async_checkpoint._start_results_queue()
    assert thread is not None
    thread.join(5)
    assert made.is_set()


@pytest.mark.parametrize(
    ("version", "specifier", "satisfied"),
    [
        ("0.4.1", "==0.4.1", True),
        ("0.4.1.0", "==0.4.1", True),
        ("0.4.1+local", "==0.4.1", True),
        ("0.4.10", "==0.4.1", False),
        ("0.7", "~=0.7.0", True),
        ("0.7.12", "~=0.7.0", True),
        ("0.7.1.post2", "~=0.7.0", True),
        ("0.8.0", "~=0.7.0", False),
        ("1.7.0", "~=0.7.0", False),
        ("0.6.9", "~=0.7.0", False),
        ("0.7.0rc1", "~=0.7.0", False),  # a pre-release satisfies no specifier
        ("not a version", "~=0.7.0", False),
    ],
)
def test_the_version_comparison_reads_pep_440_releases(version: str, specifier: str, satisfied: bool) -> None:
    assert versions.satisfies(version, specifier) is satisfied


def test_an_unsupported_specifier_is_refused_not_guessed() -> None:
    with pytest.raises(ValueError, match="unsupported"):
        versions.satisfies("0.7.0", ">=0.7")
