"""Supervision duties driven by hand against a scripted backend: every duty's pass, in order, on demand."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from unittest import mock

import pytest

from api.schemas.spec import JobSpec
from workers.backends.base import AttemptPhase, AttemptReading, LaunchRequest

PASS_READ_WAIT_S = 30.0


@dataclass
class ScriptedBackend:
    """Reports whatever status the test sets per attempt; records launches and teardowns (`stop` or `cancel`).
    An attempt in `stopping` does not stop until the test takes it out."""

    name: str = "local"
    statuses: dict[int, AttemptReading] = field(default_factory=dict)
    launches: list[LaunchRequest] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    stopping: set[int] = field(default_factory=set)
    fail_launch: bool = False
    retryable: bool = False
    released: list[str] = field(default_factory=list)
    can_exclude_nodes: bool = True

    def render(self, request: LaunchRequest) -> str:
        return "scripted"

    def launch(self, request: LaunchRequest) -> None:
        if self.fail_launch:
            error = RuntimeError("cluster unreachable")
            error.retryable = self.retryable  # type: ignore[attr-defined]
            raise error
        self.launches.append(request)

    def status(self, job_id: str, attempt: int, spec: JobSpec) -> AttemptReading:
        return self.statuses.get(attempt, AttemptReading(AttemptPhase.running))

    def stop(self, job_id: str, attempt: int, spec: JobSpec) -> bool:
        if attempt not in self.cancels:
            self.cancels.append(attempt)
        return attempt not in self.stopping

    def cancel(self, job_id: str, attempt: int, spec: JobSpec) -> None:
        self.cancels.append(attempt)

    def delete_job_resources(self, job_id: str, spec: JobSpec) -> None:
        self.released.append(job_id)


def use_backend(monkeypatch: pytest.MonkeyPatch, backend: object) -> None:
    """Every duty gets its backend through `workers.backends.get_backend`."""
    monkeypatch.setattr("workers.backends.get_backend", lambda name: backend)


def supervise(job_id: str | None = None, *, force_launch: bool = False) -> None:
    """With force_launch, what the submit task does for `job_id`; else one pass of every duty, in order."""
    from api.core import queue
    from api.core.db import session_scope
    from api.services.ingest import liveness_writer
    from workers.supervision import (
        cancel_jobs,
        detect_silent_ranks,
        launch_attempts,
        reconcile_attempts,
        release_finished_jobs,
        time_out_pending,
    )

    liveness_writer.flush()  # the reports this process took, as the database would have them by now
    with session_scope() as session:
        if force_launch:
            assert job_id is not None
            launch_attempts.launch(session, job_id)
            return
        relaunch: list[str] = []  # the submit tasks a job restart sends, run here as a worker would run them
        send = queue.send

        def submit_here(task: str, *args: Any, countdown: float | None = None) -> bool:
            if task != queue.SUBMIT_JOB:
                return send(task, *args, countdown=countdown)
            relaunch.append(args[0])
            return True

        with mock.patch.object(queue, "send", submit_here):
            for run_once in (
                launch_attempts.run_once,
                # A test's pass applies every backend read it starts: on a loaded machine one can outlast the
                # product's wait (a read left in flight is applied by a later pass, after what the test does next).
                functools.partial(reconcile_attempts.run_once, wait_s=PASS_READ_WAIT_S),
                detect_silent_ranks.run_once,
                time_out_pending.run_once,
                cancel_jobs.run_once,
                release_finished_jobs.run_once,
            ):
                run_once(session)
        for restarted in relaunch:
            launch_attempts.launch(session, restarted)


def last_seen(job_id: str, silent_s: dict[int, float], now: datetime) -> None:
    """Date each rank's last heartbeat `silent_s[rank]` seconds before `now`."""
    from api.core.db import session_scope
    from api.database.tables import RankLiveness
    from api.services.ingest import liveness_writer

    liveness_writer.flush()
    with session_scope() as session:
        for rank, seconds in silent_s.items():
            row = session.get(RankLiveness, (job_id, rank))
            assert row is not None
            row.last_seen = now - timedelta(seconds=seconds)
