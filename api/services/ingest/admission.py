"""How many node reports one API process stores in transactions at once, and what happens past that.

A report with events is stored in a transaction before its reply (an acknowledged event is stored). After
a start or a restart every rank's `running` event comes within a second or two: 2,048 such reports for a
16,384-rank job. Queued behind the database pool, they outlived the agents' 5 s read timeout, the resends
piled onto the queue, and ingest collapsed (bench/RESULTS.md, scale: 3.7 % of node beats delivered).

So a process runs at most `limit` report transactions at once (its database pool size: more would only
wait for a connection, each holding a thread), and keeps at most `limit` reports waiting for a group commit
(group_commit.py: those are stored many to a transaction, so that limit is larger).
Past that a report is shed: its liveness is taken on the
fast path (soft state: the node does not go silent meanwhile) and it is answered 503 with Retry-After.
The agent keeps its events and sends them again after that wait.

The wait grows with the shedding: a shed report costs the API a parse and a liveness write, and 2,048
agents retrying every second or two spend the cores the transactions need. Retry-After is drawn at
random (the agents spread out) between 1 s and 1 + (reports shed in the last second) / `limit`, at most
two report intervals (`contract.retry_after_max_s`), so that a node's liveness still arrives well inside
its heartbeat timeout (at least three intervals).
"""

from __future__ import annotations

import collections
import random
import threading
import time

from ftplane import contract


class TransactionSlots:
    """A count of report transactions in flight, bounded by `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.shed = 0  # reports answered 503 since the process started
        self._lock = threading.Lock()
        self._recent: collections.deque[float] = collections.deque()  # when the last second's reports were shed

    def take(self) -> bool:
        """One slot, or False (and the report counts as shed) when all `limit` are taken."""
        with self._lock:
            if self.in_flight >= self.limit:
                self.shed += 1
                now = time.monotonic()
                self._recent.append(now)
                while self._recent[0] < now - 1.0:
                    self._recent.popleft()
                return False
            self.in_flight += 1
            return True

    def retry_after(self, interval_s: float | None) -> int:
        """Seconds a shed report's agent should wait (the module's rule), for an agent reporting every
        `interval_s` (1 s when it does not say)."""
        with self._lock:
            shed_last_second = len(self._recent)
        ceiling = min(contract.retry_after_max_s(interval_s or 1.0), 1 + shed_last_second / max(1, self.limit))
        return max(1, round(random.uniform(1, max(1.0, ceiling))))

    def give_back(self) -> None:
        with self._lock:
            self.in_flight -= 1


_slots: dict[str, TransactionSlots] = {}
_slots_lock = threading.Lock()


def slots(kind: str, limit: int) -> TransactionSlots:
    """This process's slots of `kind` (made on first use with `limit`): "alone", reports stored each in a
    transaction of its own (the settings' database pool size); "grouped", reports waiting for a group commit
    (group_commit.py)."""
    with _slots_lock:
        held = _slots.get(kind)
        if held is None or held.limit != limit:
            held = _slots[kind] = TransactionSlots(limit)
        return held
