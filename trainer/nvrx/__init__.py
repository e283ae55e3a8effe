"""Every place the trainer hooks into NVIDIA's resiliency extension (NVRx), one module per mechanism, as
NVRx's own subpackages are:

- `versions`: which NVRx is installed, and which versions the code below was read against;
- `heartbeats` (NVRx's fault_tolerance): ft_launcher's in-job restart and hang detection. Each rank sends
  heartbeats over IPC to its rank monitor; a rank silent for `--ft-rank-heartbeat-timeout` is killed and
  the worker group restarted;
- `inprocess_restart` (NVRx's inprocess): the training function runs inside `inprocess.Wrapper`, and on a
  fault on any rank it is re-entered in the same processes;
- `async_checkpoint` (NVRx's checkpointing): the async checkpoint engine on CUDA, a
  torch.distributed.checkpoint written from a separate process while training goes on.

Version notes (the trainer runs on nvidia-resiliency-ext 0.4.1 and 0.7.x):
- On CUDA the trainer expects NVRx 0.7.x (`versions.NVRX_FOR_CUDA`, pyproject's `gpu` extra): the async
  writer's warm-up and cached plan were written against it, and tests/trainer/nvrx/test_cuda.py runs on it
  (bench/gpu_setup.sh, one GPU). `NvrxAsyncSaver` warns on any other version. 0.4.1 is what CPU machines
  install (the Makefile's pin), where the async engine is `dcp.async_save`.
- The few private NVRx attributes used (0.4.1's `_get_write_results_queue`, its
  `AsyncCallsQueue.async_calls` and `persistent_caller`) are touched only on the versions whose source
  they were read in (`versions.NVRX_INTERNALS_READ`, checked by `versions.internals_read()`); elsewhere
  the code takes a public call or does without (tests/trainer/nvrx/test_versions.py).
- NVRx marks in-process restart deprecated from 0.6 on. ftplane keeps the rung (it is the cheapest where
  it works); `inprocess_restart.inprocess_available()` says whether the installed NVRx still has the
  Wrapper, and the SDK runs the training function unwrapped (the next rung, ft_launcher's in-job
  restart, then handles faults) where it does not.
"""
