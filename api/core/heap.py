"""The garbage collector of a long-running ftplane process (API worker, Celery worker, beat), set for a server.

CPython's full collection walks every tracked object, and nothing else runs while it does. A started API process
holds a large heap that lives as long as the process (modules, SQLAlchemy's mappers, pydantic's validators,
FastAPI's routes); under a 16,384-rank job's reports (bench/scale.py) each full collection took 80-200 ms, one
every few seconds, and every request in flight waited that long: that was the reports' p99. Two settings change it:

- what start-up made is moved out of the collector's sight (`gc.freeze`): a full collection then walks only what
  was made since;
- the youngest generation is collected after more allocations: a request's objects that outlive one or two young
  collections, because the request was waiting on the database, are promoted towards the old generation and make
  full collections come sooner. Collecting less often lets them die young; a young collection walks only the
  young, so the pause stays short.

Measured with both (bench/RESULTS.md, scale, 2026-12-04): no full collection in an API process after its start-up
over a 90 s run at 256 reports/s, young collections of 4-8 ms (a few up to 25-35 ms). The two were not measured
apart. Reference cycles are still collected: this changes when, not whether.
"""

from __future__ import annotations

import gc

# Allocations (less deallocations) between young collections: CPython's default is 700.
YOUNG_THRESHOLD = 50_000


def settle() -> None:
    """Call once a process has started, before it serves: freeze what start-up made, collect young less often."""
    freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)


def freeze() -> None:
    """Collect, then keep what is left out of later collections. Called again, it first lets the collector see
    what the last call froze."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
