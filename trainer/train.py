"""The training entrypoint: read top to bottom.

`main` sets up what lives as long as the process (reporter, fault injector,
NVRx heartbeat client, the rendezvous store) and runs `train`, wrapped in
NVRx's in-process restart when it is on. `train` is one iteration of that
restart loop: process group, model, FSDP2 sharding, optimizer, checkpointer,
resume, then the loop. Each step: inject a due fault, train, beat (NVRx
heartbeat, Wrapper progress, control-plane heartbeat), checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer import nvrx
from trainer.checkpoint import Checkpointer
from trainer.config import Config, parse_config
from trainer.distributed import Placement, create_store, destroy_process_group, init_process_group
from trainer.faults import FaultInjector, marker_dir
from trainer.model import Transformer, count_parameters, synthetic_batch
from trainer.reporter import Reporter

log = logging.getLogger("trainer")

EXIT_FLUSH_S = 5.0
FAILURE_FLUSH_S = 2.0


def main(argv: list[str] | None = None) -> int:
    cfg = parse_config(argv)
    placement = Placement.from_environment(cfg)
    _setup_logging(placement.rank)
    if placement.rank == 0:
        log.info("config: %s", cfg)

    reporter = Reporter(cfg.url, cfg.job_id, cfg.attempt, cfg.token, report_interval_s=cfg.report_interval_s)
    faults = FaultInjector(
        cfg.faults,
        rank=placement.rank,
        job_id=cfg.job_id,
        markers=marker_dir(cfg.checkpoint_dir, cfg.job_id),
        reporter=reporter,
    )
    reporter.on_faults = faults.add_directives
    heartbeats = nvrx.HeartbeatClient()
    store = create_store(placement)
    causes = nvrx.RestartCauses(store, placement.restart_count)

    if placement.restart_count > 0 and placement.local_rank == 0:
        # ft_launcher restarted the workers. Every node's local rank 0 says so under the same key.
        reporter.event(
            "injob_restart",
            rank=placement.rank,
            key=f"injob_restart:{cfg.job_id}:{cfg.attempt}:{placement.restart_count}",
            details={"restart_count": placement.restart_count},
        )

    train_iteration = functools.partial(train, cfg, placement, reporter, faults, heartbeats, store, causes)
    run: Callable[[], None] = (
        nvrx.wrap_inprocess(train_iteration, cfg, placement)
        if cfg.inprocess
        else functools.partial(train_iteration, nvrx.Iteration())
    )

    try:
        run()
    except BaseException:
        traceback.print_exc()
        reporter.close(timeout=FAILURE_FLUSH_S)
        sys.stderr.flush()
        # Leave without running atexit hooks, which could wait on a background save stuck on a dead peer.
        os._exit(1)
    heartbeats.close()
    reporter.close(timeout=EXIT_FLUSH_S)
    return 0


def train(
    cfg: Config,
    placement: Placement,
    reporter: Reporter,
    faults: FaultInjector,
    heartbeats: nvrx.HeartbeatClient,
    store: torch.distributed.Store,
    causes: nvrx.RestartCauses,
    iteration: nvrx.Iteration,
) -> None:
    """One iteration of the in-process restart loop (the only one without in-process restart)."""
    rank, world_size = init_process_group(placement, store, iteration.index)
    heartbeats.connect()
    if iteration.index > 0 and rank == 0:
        cause = causes.first(iteration.index - 1)
        reporter.event(
            "inprocess_restart",
            rank=rank,
            key=f"inprocess_restart:{cfg.job_id}:{cfg.attempt}:{placement.restart_count}:{iteration.index}",
            details={
                "iteration": iteration.index,
                "cause": cause or "unknown",
                "cause_class": "exception" if cause else "unknown",
                "restart_count": placement.restart_count,
            },
        )

    step = 0
    checkpointer: Checkpointer | None = None
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

        root = Path(cfg.checkpoint_dir) if cfg.checkpoint_dir else _scratch_dir(cfg)
        checkpointer = Checkpointer(
            root,
            engine=cfg.checkpoint_engine,
            interval=cfg.checkpoint_interval,
            keep=cfg.checkpoint_keep,
            rank=rank,
            reporter=reporter,
            device=placement.device,
        )
        step = start_step = checkpointer.load_latest(model, optimizer)

        if rank == 0:
            log.info(
                "training %s (%.2fM params) on %d %s rank(s), steps %d..%d (iteration %d, restart %d)",
                cfg.model,
                n_params / 1e6,
                world_size,
                placement.device.type,
                start_step,
                cfg.steps,
                iteration.index,
                placement.restart_count,
            )
        reporter.event(
            "running",
            rank=rank,
            step=start_step,
            details={
                "restart_count": placement.restart_count,
                "iteration": iteration.index,
                "world_size": world_size,
                "start_step": start_step,
                "pid": os.getpid(),
                "local_rank": placement.local_rank,
                "parameters": n_params,
                "device": placement.device.type,
                "checkpoint_engine": checkpointer.engine,
                "nvrx_heartbeats": heartbeats.connected,
                "inprocess": cfg.inprocess,
                "nvrx_version": nvrx.NVRX_VERSION,
                "torch_version": torch.__version__,
            },
        )

        metrics = _open_metrics(cfg, rank)
        tokens_per_step = cfg.batch_size * args.seq_len
        for step in range(start_step, cfg.steps):
            faults.before_step(step)  # may raise, kill this process, or never return

            started = time.perf_counter()
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
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()
            if cfg.step_delay_s:
                time.sleep(cfg.step_delay_s)
            step_s = time.perf_counter() - started
            done = step + 1

            # Liveness, three ways: ft_launcher's rank monitor, the in-process Wrapper, the control plane.
            heartbeats.beat()
            iteration.ping()
            enqueued = time.perf_counter()
            reporter.heartbeat(rank, done, throughput=tokens_per_step / step_s, loss=loss_value)
            enqueue_s = time.perf_counter() - enqueued

            checkpointer.poll()
            if step == start_step:
                checkpointer.warm_up(model, optimizer)  # the optimizer's state exists from here on
            if checkpointer.due(done):
                checkpointer.save(done, model, optimizer)

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
        step = cfg.steps

        # The final state is always saved.
        if checkpointer.enabled and checkpointer.last_saved_step != cfg.steps:
            checkpointer.save(cfg.steps, model, optimizer)
        checkpointer.wait()
        checkpointer.close()
        if metrics is not None:
            metrics.close()
    except BaseException as exc:
        _report_failure(exc, cfg, reporter, causes, rank, step, iteration)
        if checkpointer is not None:
            checkpointer.abandon()
        raise
    finally:
        destroy_process_group()
    if rank == 0:
        log.info("training finished at step %d", cfg.steps)


def _report_failure(
    exc: BaseException,
    cfg: Config,
    reporter: Reporter,
    causes: nvrx.RestartCauses,
    rank: int,
    step: int,
    iteration: nvrx.Iteration,
) -> None:
    """`rank_failed`, before the Wrapper restarts us or the process dies. Ranks that fail because
    another one did (a collective timed out) say so: `first_to_fail` is true only for the first rank
    that reported a failure in this iteration, and `first_failure` names it."""
    if nvrx.is_restart_signal(exc):
        log.warning("rank %d interrupted for an in-process restart: %s", rank, exc)
        return
    cause = f"{type(exc).__name__}: {exc}"
    first, first_cause = causes.record(iteration.index, rank, cause)
    log.error("rank %d failed at step %d: %s", rank, step, cause)
    reporter.event(
        "rank_failed",
        rank=rank,
        step=step,
        details={
            "cause": type(exc).__name__,
            "cause_class": "exception",
            "rank": rank,
            "exception": "".join(traceback.format_exception_only(exc)).strip()[:4000],
            "first_to_fail": first,
            "first_failure": first_cause,
            "iteration": iteration.index,
            "inprocess": cfg.inprocess,
        },
    )
    if not cfg.inprocess:
        reporter.flush(FAILURE_FLUSH_S)


def _scratch_dir(cfg: Config) -> Path | None:
    """Checkpoints without FTPLANE_CHECKPOINT_DIR: a per-job directory on this machine."""
    if cfg.checkpoint_engine == "none":
        return None
    tmp = os.environ.get("TMPDIR") or "/tmp"
    return Path(tmp) / f"ftplane-{cfg.job_id or 'standalone'}" / "checkpoints"


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
    logging.getLogger("httpx").setLevel(logging.WARNING)
