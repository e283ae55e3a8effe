"""What one rank sends its node's agent: events with their idempotency keys, checkpoints, a request
to exclude the node. Queued and sent by the channel's thread (trainer/sdk/channel.py); nothing here
waits on the network. Without an agent every report is a no-op that still returns its key.

`Run` (trainer/sdk/run.py) adds the training loop's side: steps, heartbeats, failures, the fault hook.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from ftplane.contract import EventType, new_event
from ftplane.trainer.sdk.channel import AgentChannel
from ftplane.trainer.sdk.environment import Environment
from ftplane.trainer.sdk.sink import checkpoint_saved_details

log = logging.getLogger("ftplane.trainer.sdk")

EXCLUDE_FLUSH_S = 2.0
EXIT_FLUSH_S = 5.0


class Reporter:
    """One rank's channel to its node's agent, and the reports any code of the rank may send."""

    def __init__(
        self,
        env: Environment,
        *,
        interval_s: float = 0.5,
        max_queued: int = 10_000,
        on_faults: Callable[[list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.env = env
        self.enabled = env.reporting
        self.rank = env.rank
        self._key_prefix = uuid.uuid4().hex[:16]  # event keys: this prefix and a counter, unique per process
        self._key_seq = 0
        self._key_lock = threading.Lock()
        self._finished = False
        self.channel: AgentChannel | None = None
        if self.enabled:
            assert env.agent_socket is not None
            self.channel = AgentChannel(
                env.agent_socket, rank=env.rank, interval_s=interval_s, max_queued=max_queued, on_faults=on_faults
            )

    # --- who and where ------------------------------------------------------------------------------

    @property
    def job_id(self) -> str | None:
        return self.env.job_id

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def restart_count(self) -> int:
        return self.env.restart_count

    @property
    def checkpoint_dir(self) -> str | None:
        return self.env.checkpoint_dir

    @property
    def attempt(self) -> int:
        return self.env.attempt

    def event(
        self,
        type: EventType,
        details: Mapping[str, Any] | None = None,
        *,
        step: int | None = None,
        key: str | None = None,
        rank: int | None = None,
    ) -> str:
        """Queue an event of this rank (sent at once, in order, kept while the agent is away); returns
        its idempotency key, `key` when given (a resend or a second sender of the same fact is then
        stored once). Never waits."""
        if key is None:
            with self._key_lock:
                self._key_seq += 1
                key = f"{self._key_prefix}-{self._key_seq}"
        if self.channel is None or self._finished:
            return key
        event = new_event(
            type, attempt=self.attempt, rank=self.rank if rank is None else rank, step=step, details=details, key=key
        )
        self.channel.send({"type": "event", "event": event})
        return key

    def checkpoint_saved(
        self,
        step: int,
        *,
        blocking_s: float,
        total_s: float | None = None,
        bytes: int | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> str:
        """The checkpoint of `step` is complete. Call it when it is (for an async save: when the write
        has finished): the training loop was held `blocking_s` of the save's `total_s` (default: all of
        it, as for a synchronous save), counted back from now."""
        total = blocking_s if total_s is None else total_s
        return self.event(
            EventType.checkpoint_saved,
            checkpoint_saved_details(step, blocking_s=blocking_s, total_s=total, bytes=bytes, **(details or {})),
            step=step,
        )

    def checkpoint_loaded(
        self,
        step: int,
        *,
        load_s: float | None = None,
        path: str | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> str:
        """Training resumed from the checkpoint of `step`."""
        facts: dict[str, Any] = {"step": step}
        if load_s is not None:
            facts["load_s"] = round(load_s, 4)
        if path is not None:
            facts["path"] = path
        return self.event(EventType.checkpoint_loaded, {**facts, **(details or {})}, step=step)

    def exclude_node(self, reason: str) -> None:
        """Ask for this node to be excluded (bad GPU, ECC errors, ...): the agent reports the node
        unhealthy, stops the launcher and leaves with the status that makes the control plane restart
        the job elsewhere. Waits up to 2 s for the message to reach the agent."""
        log.error("rank %d asks to exclude this node: %s", self.rank, reason)
        if self.channel is None or self._finished:
            return
        self.channel.send({"type": "exclude_node", "rank": self.rank, "reason": str(reason)[:2000]})
        self.flush(EXCLUDE_FLUSH_S)

    def flush(self, timeout: float = EXIT_FLUSH_S) -> bool:
        """Wait up to `timeout` s until everything queued has reached the agent; True if so (always
        when reporting is off)."""
        if self.channel is None:
            return True
        return self.channel.flush(timeout)
