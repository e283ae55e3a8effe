"""The training entrypoint: read top to bottom.

`main` sets up what lives as long as the process: the rendezvous store and the SDK's run, which
reports to the node agent, sends ft_launcher's rank heartbeats and injects faults. It runs `train`
through the SDK's `inprocess` helper: wrapped in NVRx's in-process restart when it is on, once
otherwise, each failure reported. `train` is one iteration of that restart loop: process group,
model, FSDP2 sharding, optimizer, checkpointer, resume, then the loop. Each step: train,
checkpoint, then `run.step()`: liveness three ways (the control plane's heartbeat, ft_launcher's
rank heartbeat, the Wrapper's progress ping), then a fault due before the next step.
Told to stop (SIGTERM: an eviction, a drain, a cancel), every rank saves the step it is at, waits for
that save to complete, and ends as SIGTERM would have: `run.should_stop()` tells all ranks at once.
The rank's own work in a step (its batch, its shard's optimizer step: no collective) is timed in
straggler sections (`compute_s` for the control plane; NVRx's detector too, on CUDA).

In-job restarts are the node agent's to report: it sees ft_launcher restart the group, and why.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import IO, NoReturn

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ftplane import sdk
from ftplane.trainer.config import Config, parse_config
from ftplane.trainer.distributed import Placement, create_store, destroy_process_group, init_process_group
from ftplane.trainer.model import Transformer, count_parameters, synthetic_batch
from ftplane.trainer.nvrx import versions as nvrx_versions

log = logging.getLogger("trainer")

EXIT_FLUSH_S = 5.0
FAILURE_FLUSH_S = 2.0


def main(argv: list[str] | None = None) -> NoReturn:
    cfg = parse_config(argv)
    placement = Placement.from_environment(cfg)
    _setup_logging(placement.rank)
    if placement.rank == 0:
        log.info("config: %s", cfg)

    # SIGTERM (passed on by the node agent and ft_launcher) asks for a save, then an end: see `train`.
    sdk.termination.install()
    store = create_store(placement)
    # Reports through the node agent; ft_launcher's rank heartbeats (NVRx RankMonitorClient) from the
    # SDK's thread; failures recorded in the store, so that each says which rank failed first.
    run = sdk.init(total_steps=cfg.steps, store=store, report_uncaught=False)
    # NVRx in-process restart, when on: after a fault, `train` is entered again in these processes.
    training = sdk.inprocess(
        functools.partial(train, cfg, placement, run, store),
        run,
        enabled=cfg.inprocess,
        soft_timeout_s=cfg.inprocess_soft_timeout_s,
        hard_timeout_s=cfg.inprocess_hard_timeout_s,
        max_iterations=cfg.inprocess_max_iterations,
        store_host=placement.master_addr,
        cuda=placement.device.type == "cuda",
    )

    try:
        training()
    except BaseException:
        traceback.print_exc()
        run.finish(timeout=FAILURE_FLUSH_S)
        sys.stderr.flush()
        # Leave without running atexit hooks, which could wait on a background save stuck on a dead peer.
        os._exit(1)
    if sdk.termination.agreed_stop():  # stopped, its checkpoint saved: never read as finished
        left = sdk.termination.seconds_left()
        run.finish(timeout=EXIT_FLUSH_S if left is None else min(EXIT_FLUSH_S, left))
        sdk.termination.end()
    run.finish(timeout=EXIT_FLUSH_S)
    # A finished rank leaves without the interpreter's teardown too: destroying torch's C++ objects there (the
    # store, gloo's threads) can abort the process (SIGABRT, "terminate called without an active exception")
    # after its last step, and ft_launcher would count a finished rank as failed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def train(cfg: Config, placement: Placement, run: sdk.Run, store: torch.distributed.Store) -> None:
    """One iteration of the in-process restart loop (the only one without in-process restart)."""
    rank, world_size = init_process_group(placement, store, run.iteration)
    checkpointer = None
    stragglers = None
    try:
        # Model, sharded with FSDP2 over all ranks.
        args = cfg.model_args
        torch.manual_seed(cfg.seed)  # every rank builds the same full model, then keeps its shard
        with placement.device:
            model = Transformer(args)
        n_params = count_parameters(model)
        mesh = init_device_mesh(placement.device.type, (world_size,))
        precision = (
            MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if placement.device.type == "cuda"
            else MixedPrecisionPolicy()
        )
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=precision)
        fully_shard(model, mesh=mesh, mp_policy=precision)

        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)

        # Checkpoints (async: NVRx's writer on CUDA), each completed one reported through the run.
        checkpointer = sdk.checkpointer(
            run,
            root=cfg.checkpoint_dir or _scratch_dir(cfg, run.job_id),
            engine=cfg.checkpoint_engine,
            interval=cfg.checkpoint_interval,
            keep=cfg.checkpoint_keep,
            rank=rank,
            device=placement.device,
        )
        start_step = checkpointer.load_latest(model, optimizer)

        if rank == 0:
            log.info(
                "training %s (%.2fM params) on %d %s rank(s), steps %d..%d (iteration %d, restart %d)",
                cfg.model,
                n_params / 1e6,
                world_size,
                placement.device.type,
                start_step,
                cfg.steps,
                run.iteration,
                run.restart_count,
            )
        # `running`, then a fault due before the first step (may raise, kill this process, or never return).
        run.start(
            start_step,
            {
                "world_size": world_size,
                "parameters": n_params,
                "device": placement.device.type,
                "checkpoint_engine": checkpointer.engine,
                "nvrx_version": nvrx_versions.NVRX_VERSION,
                "torch_version": torch.__version__,
            },
        )

        metrics = _open_metrics(cfg, rank)
        tokens_per_step = cfg.batch_size * args.seq_len
        # Straggler sections: the rank's own work, timed for the heartbeat's compute_s (and by NVRx on CUDA).
        stragglers = sdk.straggler_detection(run, cuda=placement.device.type == "cuda")
        for step in range(start_step, cfg.steps):
            started = time.perf_counter()
            with stragglers.section("batch"):
                inputs, targets = synthetic_batch(
                    args,
                    batch_size=cfg.batch_size,
                    seed=cfg.seed,
                    step=step,
                    dp_rank=rank,
                    device=placement.device,
                )
            logits = model(inputs)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            torch.autograd.backward(loss)
            with stragglers.section("optimizer"):  # FSDP2: each rank updates its own shard
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if cfg.step_delay_s:
                    time.sleep(cfg.step_delay_s)  # stands in for more work of the rank's own
            loss_value = loss.item()
            step_s = time.perf_counter() - started
            done = step + 1

            checkpointer.poll()
            if step == start_step:
                checkpointer.warm_up(model, optimizer)  # the optimizer's state exists from here on
            # Told to stop (any rank, e.g. the one node being evicted): every rank saves this step, then ends.
            stopping = run.should_stop()
            if checkpointer.due(done) or (stopping and checkpointer.last_saved_step != done):
                checkpointer.save(done, model, optimizer)

            # Liveness, three ways: the control plane's heartbeat (through the node agent), ft_launcher's
            # rank heartbeat, the in-process Wrapper's progress ping. Then a fault due before the next
            # step fires (may raise, kill this process, or never return).
            reported = time.perf_counter()
            run.step(done, loss=loss_value, tokens=tokens_per_step, inject=not stopping)
            enqueue_s = time.perf_counter() - reported  # what the report cost this step

            if metrics is not None:
                metrics.write(
                    json.dumps(
                        {
                            "step": done,
                            "loss": loss_value,
                            "step_s": step_s,
                            "enqueue_s": enqueue_s,
                            "t": time.time(),
                        }
                    )
                    + "\n"
                )
                metrics.flush()
            if rank == 0 and (done % cfg.log_every == 0 or done == cfg.steps):
                log.info(
                    "step %d/%d loss %.4f %.0f tokens/s",
                    done,
                    cfg.steps,
                    loss_value,
                    tokens_per_step / step_s,
                )
            if stopping:
                if rank == 0:
                    log.warning("told to stop: stopping at step %d (its checkpoint completes before the end)", done)
                break
        else:
            # The final state is always saved.
            if checkpointer.enabled and checkpointer.last_saved_step != cfg.steps:
                checkpointer.save(cfg.steps, model, optimizer)
        checkpointer.wait()  # a save in flight (async) is complete before the rank goes on, or ends
        checkpointer.close()
        if metrics is not None:
            metrics.close()
    except BaseException:
        # The SDK reports the failure (`rank_failed`); what is saved from here on is never complete.
        if checkpointer is not None:
            checkpointer.abandon()
        raise
    finally:
        if stragglers is not None:
            stragglers.close()
        destroy_process_group()
    if rank == 0 and not sdk.termination.agreed_stop():
        log.info("training finished at step %d", cfg.steps)


def _scratch_dir(cfg: Config, job_id: str | None) -> Path | None:
    """Checkpoints without FTPLANE_CHECKPOINT_DIR: a per-job directory on this machine."""
    if cfg.checkpoint_engine == "none":
        return None
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / f"ftplane-{job_id or 'standalone'}" / "checkpoints"


def _open_metrics(cfg: Config, rank: int) -> IO[str] | None:
    if not cfg.metrics_file:
        return None
    path = Path(cfg.metrics_file.replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "a")  # noqa: SIM115 - closed at the end of training


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=os.environ.get("FTPLANE_LOG_LEVEL", "INFO").upper(),
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
