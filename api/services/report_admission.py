"""How many node reports one API process stores in transactions at once, and what happens past that.

A report with events is stored in a transaction before its reply (an acknowledged event is stored). After
a start or a restart every rank's `running` event comes within a second or two: 2,048 such reports for a
16,384-rank job. Queued behind the database pool, they outlived the agents' 5 s read timeout, the resends
piled onto the queue, and ingest collapsed (bench/RESULTS.md, scale: 3.7 % of node beats delivered).

So a process runs at most `limit` report transactions at once (its database pool size: more would only
wait for a connection, each holding a thread). Past that a report is shed: its liveness is taken on the
fast path (soft state: the node does not go silent meanwhile) and it is answered 503 with Retry-After.
The agent keeps its events and sends them again after that wait, with its backoff's jitter.
"""

from __future__ import annotations

import threading

RETRY_AFTER_S = 1


class TransactionSlots:
    """A count of report transactions in flight, bounded by `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.shed = 0  # reports answered 503 since the process started
        self._lock = threading.Lock()

    def take(self) -> bool:
        """One slot, or False (and the report counts as shed) when all `limit` are taken."""
        with self._lock:
            if self.in_flight >= self.limit:
                self.shed += 1
                return False
            self.in_flight += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.in_flight -= 1


_slots: TransactionSlots | None = None
_slots_lock = threading.Lock()


def slots(limit: int) -> TransactionSlots:
    """This process's slots (made on first use with `limit`, the settings' database pool size)."""
    global _slots
    with _slots_lock:
        if _slots is None or _slots.limit != limit:
            _slots = TransactionSlots(limit)
        return _slots
