"""Node reports stored many to a transaction (group commit).

After a start or a restart every node sends its ranks' `running` events within a second or two:
2,048 reports for a 16,384-rank job. Alone, each is a transaction of its own (a row lock, an
insert, a query for webhook subscriptions, a commit: about 6 ms of the API's CPU, bench/RESULTS.md
ingest). So one thread per process takes every report waiting, up to MAX_REPORTS, and stores them
together: each job's row locked once, all its reports' events in one statement (what they mean
applied in order, as for one report), announced once, one commit. Each report's reply then says what
of its own was stored. The row is locked shared when, as the entry point saw the job (node_report.py), none of the job's
reports can change it (`exclusive` False: then the batches of several API processes run side by
side), else exclusively.

The guarantee is the one of a report stored alone: its reply comes only after the transaction that
stored its events has committed. A report the batch finds would change its job after all (the
entry point's cached view was stale) and every report of a batch that failed are answered None: the caller
stores each alone, so one bad report never fails the others.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from api import models
from api.core.db import session_scope
from api.core.errors import ApiError
from api.schemas.reports import NodeReport, ReportResult
from api.services.ingest import caches, reporting, rules

log = logging.getLogger(__name__)

MAX_REPORTS = 64  # per transaction: at 8 events each, 512 events (one statement per 1,000)

# What a waiting report is answered: its result and the job's attempt; None to store it alone.
Outcome = tuple[ReportResult, int] | None


@dataclass(eq=False)
class _Waiting:
    job_id: str
    report: NodeReport
    look_for_faults: bool
    exclusive: bool = False  # may change the job's row (the entry point's view): the job's row is locked exclusively
    answer: Future[Outcome] = field(default_factory=Future)


class GroupCommit:
    """One thread storing the reports handed to it, all those waiting in each transaction."""

    def __init__(self, max_reports: int = MAX_REPORTS) -> None:
        self.max_reports = max_reports
        self._waiting: queue.SimpleQueue[_Waiting] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(
        self, job_id: str, report: NodeReport, *, look_for_faults: bool, exclusive: bool = False
    ) -> Future[Outcome]:
        """Queue a report; the future is answered once its transaction has committed, or with None (store it
        alone), or with an ApiError."""
        waiting = _Waiting(job_id, report, look_for_faults, exclusive)
        self._waiting.put(waiting)
        self._ensure_thread()
        return waiting.answer

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ftplane-group-commit", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            batch = [self._waiting.get()]
            while len(batch) < self.max_reports:
                try:
                    batch.append(self._waiting.get_nowait())
                except queue.Empty:
                    break
            self.store(batch)

    def store(self, batch: list[_Waiting]) -> None:
        """Store `batch` in one transaction and answer each of its reports (not those whose request went away
        before the batch began: their agents send them again)."""
        batch = [w for w in batch if w.answer.set_running_or_notify_cancel()]
        outcomes: dict[_Waiting, Outcome | ApiError] = {}
        locked_exclusively = set()
        try:
            with session_scope() as session:
                # jobs' rows locked in id order: two processes' batches never wait on each other in a circle
                for job_id, group in itertools.groupby(sorted(batch, key=lambda w: w.job_id), lambda w: w.job_id):
                    reports = list(group)
                    if any(w.exclusive for w in reports):
                        locked_exclusively.add(job_id)
                    outcomes.update(_store_job(session, job_id, reports, exclusive=job_id in locked_exclusively))
        except Exception:
            log.exception("a batch of %d reports failed; each is stored alone", len(batch))
            outcomes, locked_exclusively = dict.fromkeys(batch), set()
        for job_id in locked_exclusively:
            caches.forget_job(job_id)  # its status, attempt, total or pending faults may have changed
        for waiting in batch:
            outcome = outcomes[waiting]
            if isinstance(outcome, ApiError):
                waiting.answer.set_exception(outcome)
            else:
                if outcome is not None and outcome[0].faults:
                    caches.forget_job(waiting.job_id)  # its pending faults changed
                waiting.answer.set_result(outcome)


def _store_job(
    session: Session, job_id: str, reports: list[_Waiting], *, exclusive: bool
) -> dict[_Waiting, Outcome | ApiError]:
    job = models.jobs.get(session, job_id, for_update=exclusive, for_share=not exclusive)
    if job is None:
        return {w: ApiError(404, f"no job with id {job_id!r}", field="job_id") for w in reports}
    outcomes: dict[_Waiting, Outcome | ApiError] = {}
    together = []
    for waiting in reports:
        refused = rules.refusal_if_ended(job.status, waiting.report)  # the entry point's cached view may be stale
        if refused is not None:
            outcomes[waiting] = refused
        elif not exclusive and rules.changes_job(job.status, job.total_steps, waiting.report):
            outcomes[waiting] = None  # its events would change the job's row: stored alone, under an exclusive lock
        else:
            together.append(waiting)
    stored = reporting.record_events(session, job, [e for w in together for e in w.report.events])
    new_keys = {row.key for row in stored}
    for waiting in together:
        keys = {e.key for e in waiting.report.events}
        mine = keys & new_keys
        new_keys -= mine  # a key sent twice in the batch is stored by the first report that carried it
        total = rules.total_steps(waiting.report)
        if total is not None and waiting.report.attempt >= job.attempt:
            job.total_steps = total  # under the shared lock it is the job's already (another was handed back)
        faults = reporting.faults_to_hand_over(session, job, waiting.report) if waiting.look_for_faults else []
        result = ReportResult(stored=len(mine), duplicates=len(keys) - len(mine), accepted=0, faults=faults)
        outcomes[waiting] = (result, job.attempt)
    return outcomes


def store_alone(job_id: str, report: NodeReport, *, look_for_faults: bool) -> tuple[ReportResult, int]:
    """One report in a transaction of its own, the job's row locked exclusively (the fallback of a report a batch
    handed back); raises the ApiError a batch would have answered."""
    waiting = _Waiting(job_id, report, look_for_faults, exclusive=True)
    with session_scope() as session:
        outcome = _store_job(session, job_id, [waiting], exclusive=True)[waiting]
    caches.forget_job(job_id)  # its status, attempt, total or pending faults may have changed
    if isinstance(outcome, ApiError):
        raise outcome
    assert outcome is not None  # under the exclusive lock nothing is handed back
    return outcome


_group_commit: GroupCommit | None = None
_group_commit_lock = threading.Lock()


def group_commit() -> GroupCommit:
    """This process's group commit (its thread starts with the first report)."""
    global _group_commit
    with _group_commit_lock:
        if _group_commit is None:
            _group_commit = GroupCommit()
        return _group_commit
