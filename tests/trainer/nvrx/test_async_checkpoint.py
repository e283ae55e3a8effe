"""NVRx's async checkpoint writer as the trainer uses it (trainer/nvrx/async_checkpoint.py), without a GPU: it
refuses the CPU, and its results queue is started off the training thread. On a GPU: test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from ftplane.trainer.nvrx import async_checkpoint


def test_async_writer_refuses_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # also where a GPU is present
    with pytest.raises(RuntimeError, match="needs CUDA"):
        async_checkpoint.NvrxAsyncSaver()


def test_the_async_writers_results_queue_is_started_off_the_training_thread() -> None:
    """NVRx makes its results queue (a Manager process, seconds to start) on the first save; the saver
    starts it on a thread at construction, so the first save finds it made."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    thread = async_checkpoint._start_results_queue()
    assert thread is not None and thread.name == "nvrx-results-queue" and thread.daemon
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert filesystem_async._results_queue is not None
    filesystem_async._results_queue.put("ping")
    assert filesystem_async._results_queue.get(timeout=10) == "ping"
