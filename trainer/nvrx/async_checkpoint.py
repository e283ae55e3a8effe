"""The async checkpoint engine on CUDA (NVRx's checkpointing): NVRx's `FileSystemWriterAsync` +
`AsyncCallsQueue` write a torch.distributed.checkpoint from a separate process while training goes on.

- The writer needs CUDA (it synchronizes the device and all-reduces CUDA tensors while finalizing); on
  CPU the async engine is `dcp.async_save`.
- The writer's results travel through one multiprocessing Manager queue per process
  (`get_write_results_queue`, `_get_write_results_queue` before), made on the first save; starting the
  manager process takes seconds, so it is started on a thread as soon as the saver exists.
- `FileSystemWriterAsync(use_cached_data_structure=...)` (0.6-ish on) keeps the GPU tensors' IPC handles
  in the writer process between saves; it is passed only where the writer takes it. Receiving them is
  most of a save's blocking time the first time, so `NvrxAsyncSaver.warm_up` has the writer receive them
  in the background (it runs a planned save's preload step alone).
"""

from __future__ import annotations

import inspect
import logging
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from ftplane.trainer.nvrx import versions

log = logging.getLogger(__name__)


def _start_results_queue() -> threading.Thread | None:
    """Make NVRx's per-process results queue (a Manager process) on a thread of its own."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    create = getattr(filesystem_async, "get_write_results_queue", None)  # public from 0.7-ish
    if create is None and versions.internals_read():
        create = getattr(filesystem_async, "_get_write_results_queue", None)
    if create is None:
        return None  # the first save makes it, while training waits
    thread = threading.Thread(target=create, name="nvrx-results-queue", daemon=True)
    thread.start()
    return thread


class NvrxAsyncSaver:
    """torch.distributed.checkpoint saves written by NVRx's async writer process (CUDA only)."""

    def __init__(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("NVRx's async checkpoint writer needs CUDA; on CPU use dcp.async_save")
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync

        if not versions.nvrx_version_matches(versions.NVRX_FOR_CUDA):
            log.warning(
                "the async checkpoint writer is tested with nvidia-resiliency-ext %s, this is %s: "
                "install ftplane[gpu] (or that version) on GPU machines",
                versions.NVRX_FOR_CUDA,
                versions.NVRX_VERSION,
            )
        self.queue = AsyncCallsQueue(persistent=True)
        self._abandoned = False
        self._results_queue_started = _start_results_queue()
        takes = inspect.signature(FileSystemWriterAsync.__init__).parameters
        self._writer_options: dict[str, Any] = {"thread_count": 2}
        if "use_cached_data_structure" in takes:
            self._writer_options["use_cached_data_structure"] = True

    def warm_up(self, state_dict: dict[str, Any]) -> None:
        """Do, in the background, what the first save would otherwise do while training waits: start the
        writer process, map the state's GPU memory into it (CUDA IPC) and pin host memory for the copy.

        A save is planned into a scratch directory (a collective, as every save) and only its preload
        step is run, as a request of its own: NVRx's writer keeps the mapped tensors under the plan's
        key (`use_cached_data_structure`), and the planning side remembers that it did, so the first
        real save, of the same structure, sends no tensors and only copies. Nothing is written; the next
        save waits for this request if it has not finished."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest

        with tempfile.TemporaryDirectory(prefix="ftplane-writer-warm-up-") as scratch:
            _, _, preload_fn, _ = self._plan(state_dict, scratch)
        if preload_fn is not None:  # None: nothing to write on this rank
            self.queue.schedule_async_request(AsyncRequest(preload_fn, (), []))  # the staged copy is dropped

    def _plan(
        self, state_dict: dict[str, Any], path: str
    ) -> tuple[Any, Callable[..., Any] | None, Callable[..., Any] | None, Any]:
        """DCP planning through NVRx's async writer: (planned, save_fn, preload_fn, save_args); the functions
        are None where this rank has nothing to write."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_plan
        from torch.distributed.checkpoint import DefaultSavePlanner

        if self._results_queue_started is not None:
            self._results_queue_started.join()  # a no-op unless this comes seconds after the start
        writer = FileSystemWriterAsync(path, **self._writer_options)
        planned = save_state_dict_async_plan(state_dict, writer, None, 0, planner=DefaultSavePlanner())
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        return planned, save_fn, preload_fn, save_args

    def schedule(self, state_dict: dict[str, Any], path: str, on_finalized: Callable[[], None]) -> dict[str, float]:
        """Plan and stage now (blocking part); the write runs in the background. `on_finalized`
        runs on every rank once all ranks' writes are done and the metadata is written. Returns the
        blocking part's stages in seconds: `plan` (DCP planning), `stage` (the writer's copy to host)."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_finalize

        started = time.monotonic()
        planned, save_fn, preload_fn, save_args = self._plan(state_dict, path)

        def finalize() -> None:
            save_state_dict_async_finalize(*planned)
            on_finalized()

        planned_at = time.monotonic()
        self.queue.schedule_async_request(AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn))
        return {"plan": planned_at - started, "stage": time.monotonic() - planned_at}

    def poll(self, blocking: bool = False) -> None:
        """Finalize the saves that are done (a collective: every rank calls it at the same step)."""
        if not self._abandoned:
            self.queue.maybe_finalize_async_calls(blocking=blocking, no_dist=False)

    @property
    def in_flight(self) -> int:
        return 0 if self._abandoned else self.queue.get_num_unfinalized_calls()

    def close(self) -> None:
        """Finalize what is left (a collective) and stop the writer process."""
        if not self._abandoned:
            self.queue.close()

    def abandon(self) -> None:
        """After a fault: stop the writer process without finalizing (no collectives with peers that
        may be gone); what was in flight never gets its completion marker, and this saver finalizes
        nothing more."""
        self._abandoned = True
        if "abort" in inspect.signature(self.queue.close).parameters:
            # Public from 0.7-ish: the writer process is stopped (SIGTERM, SIGKILL after NVRx's
            # timeout), nothing is finalized.
            self.queue.close(abort=True)
        elif versions.internals_read():
            # 0.4.1: drop the unfinalized calls, then stop the writer (it finishes the write in
            # progress first).
            self.queue.async_calls.clear()
            caller = getattr(self.queue, "persistent_caller", None)
            if caller is not None:
                caller.close()
        else:
            log.warning(
                "nvidia-resiliency-ext %s: cannot stop the async checkpoint writer without finalizing; "
                "it ends with this process (what it was writing is never marked complete)",
                versions.NVRX_VERSION,
            )
