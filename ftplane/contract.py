"""The contract between the node side (node agent, SDK) and the control plane: the names, keys,
limits and codes both sides must agree on. Standard library only: both sides import it.

- `EventType`: every event type a job's history may hold;
- idempotency keys of the facts both sides may report (a resend or a second sender stores it once);
- the node agent's exit codes, read by the backends;
- the limits of one node report;
- the names of the zero-code progress presets;
- the environment variables a backend sets for the node agent and the ranks;
- `new_event`: an event as a report carries it;
- the node's kept logs: where each rank's lines are kept, their records, and a failure's tail;
- `root_cause`: which rank failure of a round is its root cause, and which are its consequences.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Final, TypeVar


class EventType(StrEnum):
    submitted = "submitted"
    scheduled = "scheduled"
    running = "running"
    heartbeat_lost = "heartbeat_lost"
    hang_detected = "hang_detected"
    rank_failed = "rank_failed"
    node_failed = "node_failed"
    node_unhealthy = "node_unhealthy"
    inprocess_restart = "inprocess_restart"
    injob_restart = "injob_restart"
    launcher_cycle = "launcher_cycle"  # ft_launcher's timing of one cycle (NVRx 0.5+), from the node agent
    job_restart = "job_restart"
    node_excluded = "node_excluded"
    checkpoint_saved = "checkpoint_saved"
    checkpoint_loaded = "checkpoint_loaded"
    fault_injected = "fault_injected"
    queued = "queued"
    scheduling_failed = "scheduling_failed"
    preempted = "preempted"
    spares_exhausted = "spares_exhausted"
    spare_unavailable = "spare_unavailable"  # a hot spare that cannot be placed or started: a fact, not a failure
    straggler_detected = "straggler_detected"
    straggler_cleared = "straggler_cleared"
    restart_storm = "restart_storm"
    progress_stalled = "progress_stalled"
    recovery_stuck = "recovery_stuck"
    node_quarantined = "node_quarantined"  # the fleet's: a node left out of new placements and spares
    node_released = "node_released"
    objective_breached = "objective_breached"  # the fleet's: an ETTR objective's budget burnt
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


# --- idempotency keys ------------------------------------------------------------------------------


def injob_restart_key(job_id: str | None, attempt: int, restart_count: int) -> str:
    """ft_launcher's `restart_count`-th worker-group restart: the node agent reports it, and the
    control plane records it when it finds one the agent did not (the same key: stored once)."""
    return f"injob_restart:{job_id}:{attempt}:{restart_count}"


def inprocess_restart_key(job_id: str | None, attempt: int, restart_count: int, iteration: int) -> str:
    """NVRx's in-process restart into `iteration`; every rank reports it, stored once."""
    return f"inprocess_restart:{job_id}:{attempt}:{restart_count}:{iteration}"


def running_key(node: str, attempt: int, restart_count: int) -> str:
    """The node agent's inferred `running` of a launcher round (no SDK said it)."""
    return f"running:{node}:a{attempt}:r{restart_count}"


def new_key() -> str:
    """A key for a fact only one sender reports."""
    return uuid.uuid4().hex


# --- the node agent's exit codes ---------------------------------------------------------------------

# 0: the launcher finished and the node is healthy; anything else but these two: the launcher's own
# exit status (its in-job restarts are spent).
VERDICT = 93  # ft_launcher's own: NVRx decided not to restart. The job fails, no job-level restart.
NODE_UNHEALTHY = 94  # this node must not be used again: a job restart with the node excluded.

# The longest a busy control plane tells an agent to wait before it sends its report again (Retry-After:
# api/services/ingest/admission.py and lateness.py): two of its report intervals, so that its liveness still
# arrives well inside its heartbeat timeout (three intervals at least).
RETRY_AFTER_MAX_INTERVALS = 2
# How long an agent's last report may take at its exit, at least; a longer interval lengthens it: the hold below (for
# an agent that holds), the longest Retry-After and the 5 s an answer may take.
EXIT_FLUSH_MIN_S = 10.0


def retry_after_max_s(report_interval_s: float) -> float:
    """The longest Retry-After the control plane gives an agent reporting every `report_interval_s`."""
    return RETRY_AFTER_MAX_INTERVALS * report_interval_s


def last_flush_hold_max_s(report_interval_s: float) -> float:
    """How long an agent that exits on its own (its launcher ended) may hold its last report before it sends it (a
    random part of this): one interval where the job's size lengthened it past 1 s, none at 1 s. Every node of a job
    exits at once at its end; held, their last reports come at the interval's pace instead of all in one second
    (trainer/agent/report_buffer.py). An agent told to stop does not hold: what replaces it waits for it."""
    return report_interval_s if report_interval_s > 1.0 else 0.0


def exit_flush_s(report_interval_s: float, held: bool = False) -> float:
    """How long a node agent reporting every `report_interval_s` keeps trying to deliver its last report; `held`:
    after holding it (an agent that exits on its own). A pod's grace counts an agent told to stop: not held."""
    hold = last_flush_hold_max_s(report_interval_s) if held else 0.0
    return max(EXIT_FLUSH_MIN_S, hold + retry_after_max_s(report_interval_s) + 5.0)


# --- the limits of one report ------------------------------------------------------------------------

MAX_EVENTS_PER_REPORT = 1000
MAX_HEARTBEATS_PER_REPORT = 20000
MAX_KEY_LENGTH = 200  # of an idempotency key: printable ASCII, no spaces
MAX_DETAILS_KEYS = 64
MAX_DETAILS_DEPTH = 16  # levels of objects and arrays inside `details`
MAX_DETAILS_BYTES = 64 * 1024  # as JSON
MAX_NODE_NAME = 253
MAX_RANK = 1_000_000
MAX_STEP = 10**12
MAX_RANKS_PER_NODE = 1024
MAX_GPUS_PER_NODE = 64


# --- zero-code progress ------------------------------------------------------------------------------

# The spec's `progress.preset`: patterns for what these frameworks print (the node agent's trainer/agent/presets.py).
PROGRESS_PRESETS: Final = ("lightning", "transformers", "torchtitan", "megatron")


# --- environment variables a backend sets ------------------------------------------------------------


class Env:
    """The variables a backend gives the node agent (which passes them on to the ranks)."""

    URL: Final = "FTPLANE_URL"
    JOB_ID: Final = "FTPLANE_JOB_ID"
    ATTEMPT: Final = "FTPLANE_ATTEMPT"
    TOKEN: Final = "FTPLANE_TOKEN"
    NODE_NAME: Final = "FTPLANE_NODE_NAME"
    AGENT_DIR: Final = "FTPLANE_AGENT_DIR"
    AGENT_ECHO: Final = "FTPLANE_AGENT_ECHO"  # "1": the launcher's output also on the node agent's stdout
    LOG_PATTERN: Final = "FTPLANE_LOG_PATTERN"
    REPORT_INTERVAL_S: Final = "FTPLANE_REPORT_INTERVAL_S"
    MASTER_ADDR: Final = "FTPLANE_MASTER_ADDR"
    CHECKPOINT_DIR: Final = "FTPLANE_CHECKPOINT_DIR"  # the job's own checkpoint directory
    CHECKPOINT_RESUME_FROM: Final = "FTPLANE_CHECKPOINT_RESUME_FROM"  # another job's, read-only (resume_from)
    FAULTS: Final = "FTPLANE_FAULTS"
    CHECKPOINT_ENGINE: Final = "FTPLANE_CHECKPOINT_ENGINE"  # the spec's checkpoint.engine: sync | async | none
    CHECKPOINT_INTERVAL: Final = "FTPLANE_CHECKPOINT_INTERVAL"  # checkpoint.interval_steps
    CHECKPOINT_KEEP: Final = "FTPLANE_CHECKPOINT_KEEP"  # checkpoint.keep: complete checkpoints kept
    INPROCESS: Final = "FTPLANE_INPROCESS"  # "1": NVRx's in-process restart is on (resiliency.inprocess)
    INPROCESS_SOFT_TIMEOUT_S: Final = "FTPLANE_INPROCESS_SOFT_TIMEOUT_S"  # set only with INPROCESS=1
    INPROCESS_HARD_TIMEOUT_S: Final = "FTPLANE_INPROCESS_HARD_TIMEOUT_S"
    INPROCESS_MAX_ITERATIONS: Final = "FTPLANE_INPROCESS_MAX_ITERATIONS"  # the in-process rung's budget
    SPARE_NODES: Final = "FTPLANE_SPARE_NODES"  # Kubernetes: the spec's resiliency.spare_nodes
    POD_NAME: Final = "FTPLANE_POD_NAME"  # Kubernetes: the node's pod
    EFA_EXPECTED: Final = "FTPLANE_EFA_EXPECTED"  # Kubernetes: "1" where the pod asked for EFA devices
    STOP_GRACE_S: Final = "FTPLANE_STOP_GRACE_S"  # seconds the ranks get after SIGTERM (resiliency.stop_grace_s)
    LOG_MAX_BYTES: Final = "FTPLANE_LOG_MAX_BYTES"  # each rank's kept output, rotated within this many bytes
    SECRET_ENV: Final = "FTPLANE_SECRET_ENV"  # names (comma-separated) of variables whose values are redacted
    PROGRESS_PRESET: Final = "FTPLANE_PROGRESS_PRESET"  # the spec's progress.preset: the agent and the ranks read it
    RANK_ENV: Final = "FTPLANE_RANK_ENV"  # the spec's `env` as JSON: the agent gives it to the ranks, not itself


# --- events ------------------------------------------------------------------------------------------


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat()


def new_event(
    type: EventType,
    *,
    attempt: int | None,
    node: str | None = None,
    rank: int | None = None,
    step: int | None = None,
    details: Mapping[str, Any] | None = None,
    key: str | None = None,
    ts: str | None = None,
) -> dict[str, Any]:
    """An event as a report carries it (the API's EventIn), with its idempotency key (a new one unless
    given) and its time (now unless given). A rank's event leaves `node` out: the node agent fills it in."""
    event: dict[str, Any] = {
        "key": key or new_key(),
        "type": str(type),
        "ts": ts or utcnow_iso(),
        "attempt": attempt,
        "rank": rank,
        "step": step,
        "details": dict(details or {}),
    }
    if node is not None:
        event["node"] = node
    return event


# --- the node's kept logs ------------------------------------------------------------------------------
#
# The node agent keeps each rank's output (stdout and stderr, as ft_launcher tees them) under its directory,
# in LOG_DIR: one file per rank, `rank<R>.jsonl`, one JSON record per line (`log_record`), and, once it
# has grown past half its bound, its previous half as `rank<R>.jsonl.1`. The control plane reads them
# (local backend) with `read_log_record`. Every line is redacted before it is kept, echoed or reported.

LOG_DIR = "logs"
LOG_MAX_BYTES = 64 * 1024 * 1024  # per rank, both halves together (a setting: Env.LOG_MAX_BYTES)
LOG_MIN_BYTES = 1024 * 1024  # half of it holds the longest line's record
LOG_LINE_MAX_BYTES = 16 * 1024  # a longer line is kept in pieces of this size
ROTATED_SUFFIX = ".1"
TAIL_LINES = 40  # of a failed rank's output, in its rank_failed and the restart's cause
TAIL_MAX_BYTES = 8 * 1024
REDACTED = "***"


def rank_log_name(rank: int) -> str:
    return f"rank{rank}.jsonl"


def rank_of_log_name(name: str) -> int | None:
    """The rank a kept log file (either half) belongs to, or None for any other file."""
    stem = name.removesuffix(ROTATED_SUFFIX)
    if not (stem.startswith("rank") and stem.endswith(".jsonl")):
        return None
    number = stem[len("rank") : -len(".jsonl")]
    return int(number) if number.isdigit() else None


def log_record(*, ts: str, rank: int, cycle: int, seq: int, line: str) -> str:
    """One kept line as its file holds it (without the newline): `seq` counts the rank's lines in the attempt."""
    return json.dumps({"ts": ts, "rank": rank, "cycle": cycle, "seq": seq, "line": line}, ensure_ascii=False)


def read_log_record(text: str) -> dict[str, Any] | None:
    """A kept line's record, or None for a line that is not one (a half-written last line)."""
    try:
        record = json.loads(text)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("line"), str):
        return None
    if not all(isinstance(record.get(k), int) for k in ("rank", "cycle", "seq")) or not isinstance(
        record.get("ts"), str
    ):
        return None
    return record


def tail_text(lines: Sequence[str], *, max_lines: int = TAIL_LINES, max_bytes: int = TAIL_MAX_BYTES) -> str:
    """The last lines of a rank's output as a failure carries them: at most `max_lines` lines and `max_bytes`
    bytes of UTF-8 (older lines go first; a single longer line keeps its end)."""
    kept: list[str] = []
    size = 0
    for line in reversed(lines[-max_lines:] if max_lines else []):
        cost = len(line.encode()) + (1 if kept else 0)
        if size + cost > max_bytes:
            if not kept:
                kept.append(line.encode()[-max_bytes:].decode(errors="ignore"))
            break
        kept.append(line)
        size += cost
    return "\n".join(reversed(kept))


# --- the root cause of a round -----------------------------------------------------------------------

Failure = TypeVar("Failure")

# What a rank's error says when its collective broke because a peer went away (the peer's failure is the
# cause, this one its consequence): gloo's closed or reset connections, NCCL's aborted communicators and
# remote errors, and the watchdog's timeouts that follow a peer's exit.
COLLECTIVE_BROKEN = re.compile(
    r"Connection closed by peer|Connection reset by peer|"
    r"NCCL communicator was aborted|ncclRemoteError|remote process exited|"
    r"Watchdog caught collective operation timeout|collective operation timeout|"
    r"ProcessGroupGloo.*(?:Timed out|timeout)|DistNetworkError|DistBackendError",
    re.IGNORECASE,
)


def collective_broken(text: str) -> bool:
    """Whether a rank's error (its exception's text) says its collective broke because a peer went away."""
    return COLLECTIVE_BROKEN.search(text) is not None


# What a launcher sends the ranks still running when it tears a failed group down: a rank ended by one of these is
# collateral of another's failure, never a root cause by its signal alone.
TEARDOWN_SIGNALS = frozenset({"SIGTERM", "SIGINT"})


def fault_signal(name: str | None) -> bool:
    """Whether a rank ended by the signal `name` (None: it exited) was killed by a fault of its own."""
    return name is not None and name not in TEARDOWN_SIGNALS


def root_cause(
    failures: Sequence[Failure],
    *,
    hung: Callable[[Failure], bool],
    signal: Callable[[Failure], str | None],
    consequence: Callable[[Failure], bool] | None = None,
) -> Failure | None:
    """The root cause among a round's rank failures (in the order they were reported): the first rank killed
    for silence, else the first killed by a signal that is not a teardown's (`signal` gives the failure's
    signal name, e.g. "SIGKILL"), else the first neither stopped by a teardown signal; of the last two, none
    that is a `consequence` (a rank whose collective broke because a peer died: `collective_broken`; NCCL's
    watchdog aborts such a rank, SIGABRT); else the first. The rest are collateral: ranks that exit on a
    broken collective, or are stopped as the group is torn down, are reported as soon as or sooner than the
    peer whose failure broke them."""

    def broke(failure: Failure) -> bool:
        return consequence is not None and consequence(failure)

    def killed(failure: Failure) -> bool:
        return fault_signal(signal(failure)) and not broke(failure)

    def own(failure: Failure) -> bool:
        return signal(failure) not in TEARDOWN_SIGNALS and not broke(failure)

    rules = [hung, killed, own]
    for rule in rules:
        for failure in failures:
            if rule(failure):
                return failure
    return failures[0] if failures else None
