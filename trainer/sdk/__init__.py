"""ftplane's SDK for a training loop: per-rank progress, checkpoints, failures and fault injection.

A job runs without it: the node agent supervises any script from its processes (and from its
output, with the spec's `progress.log_pattern`). With it, each rank reports its own steps (hang
detection per rank, progress and ETA), its checkpoints (goodput's stall accounting), its
failures with their causes, and it can have faults injected at a step. A loop integrates it in a
few lines (examples/byo/train_sdk.py is a whole script):

    from ftplane import sdk

    run = sdk.init(total_steps=args.steps)
    start = load_checkpoint(...)                   # your code
    if start:
        run.checkpoint_loaded(start)
    run.start(start)                               # reports `running`: goodput starts the run here
    for step in range(start, args.steps):
        loss = train_step(...)                     # your code
        if (step + 1) % every == 0:
            seconds, size = save_checkpoint(...)   # your code
            run.checkpoint_saved(step + 1, blocking_s=seconds, bytes=size)
        run.step(step + 1, loss=loss, tokens=tokens_per_step)
    run.finish()

The API (every call is safe from the training thread; none waits on the network):

- `init(total_steps=None, *, interval_s=0.5, nvrx_heartbeats=True, store=None, report_uncaught=True)`
  returns the process's `Run`, read from the environment the backend, the node agent and the
  launcher set (FTPLANE_AGENT_SOCKET, FTPLANE_URL, FTPLANE_JOB_ID, FTPLANE_ATTEMPT,
  FTPLANE_CHECKPOINT_DIR, FTPLANE_FAULTS, RANK, LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RESTART_COUNT).
  Without FTPLANE_AGENT_SOCKET or FTPLANE_URL every report is a no-op.
- `Run.start(step=0, details=None)`, `Run.step(n, *, loss=None, tokens=None)`: the loop (re)starts;
  `n` steps are done. `step` is O(1) with no I/O; the fault hook runs in both.
- `with Run.compute():` times a section of the rank's own work in the step (no collective inside);
  the heartbeat carries the step's total as `compute_s`, what straggler detection compares across
  ranks (in synchronous training every rank's step time is the job's).
- `Run.checkpoint_saved(step, *, blocking_s, total_s=None, bytes=None, details=None)`,
  `Run.checkpoint_loaded(step, *, load_s=None, path=None, details=None)`.
- `Run.event(type, details=None, *, step=None, key=None, rank=None)`: any event of the fault history.
- `Run.failed(exc, *, step=None, details=None)`: `rank_failed` with cause_class `exception` (an
  uncaught exception is reported so by default, and `with sdk.init(...) as run:` does it too).
- `Run.exclude_node(reason)`: this node must not be used again (the agent stops it and the control
  plane restarts the job elsewhere).
- `with Run.phase("validation"):` work that makes no steps (validation, a checkpoint save) is no hang:
  heartbeats go on meanwhile, for at most its timeout (trainer/sdk/phases.py).
- `Run.step(n, ..., inject=False)` then `Run.before_step(n)`: for a loop whose checkpoint of step `n` is
  written after it reports the step (a framework's callback): the fault due at `n` fires in `before_step`.
- `Run.flush(timeout=5.0)`, `Run.finish(timeout=5.0)` (also run at interpreter exit).
- `inprocess(fn, run=None, **options)`: NVRx's in-process restart around `fn` (trainer/sdk/restart.py).
- `checkpointer(run=None, **options)`: async DCP checkpoints reported through the run
  (trainer/sdk/checkpointing.py).
- `termination.install()`, `termination.requested()`, `termination.seconds_left()`: learn that the rank
  is being stopped (SIGTERM: an eviction, a drain, a cancel) and save before the grace period ends;
  `Run.should_stop(group=None)` (a collective: every rank, same step) is true on every rank once any was
  told, then save and `termination.end()` (trainer/sdk/termination.py).
- `straggler_detection(run=None, **options)`: NVRx's straggler detection around the run's sections, its
  score sent with the heartbeats, where CUDA is (trainer/sdk/stragglers.py).

The frameworks' callbacks, one line each: `ftplane.sdk.lightning.FtplaneCallback` (trainer/sdk/lightning.py)
and `ftplane.sdk.transformers.FtplaneCallback` (trainer/sdk/transformers.py); they import their framework,
so they are not among the names below.

Under ft_launcher the run also sends the launcher's rank monitor the heartbeats its hang detection
needs (from a thread, once per interval in which `step()` was called: trainer/nvrx/heartbeats.py).
Dependencies: the standard library; torch and NVRx only where a helper needs them.
"""

from ftplane.trainer.sdk import termination
from ftplane.trainer.sdk.checkpointing import checkpointer
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.process_run import current, init
from ftplane.trainer.sdk.restart import inprocess
from ftplane.trainer.sdk.run import Run
from ftplane.trainer.sdk.sink import EventSink
from ftplane.trainer.sdk.stragglers import straggler_detection

__all__ = [
    "Environment",
    "EventSink",
    "Run",
    "checkpointer",
    "current",
    "inprocess",
    "init",
    "straggler_detection",
    "termination",
]
