"""The order the suite's tests are handed to pytest-xdist's work-stealing scheduler in.

`--dist worksteal` gives each of N workers a contiguous N-th of the list to start with; a worker that runs
out takes half of the longest queue left, from its end. Sorting the slow tests (marked `slow`: real jobs,
servers, benchmarks' smoke runs) to the front handed every one of them to the first worker, which then ran
alone for minutes after the others were done. Here the slow tests are dealt to the N starting shares, a whole
module to one share (its module-scoped server starts once), the heaviest module first to the lightest share;
each share starts with its slow tests and is filled up to an equal length with the rest, which are what
idle workers steal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def deal(items: Sequence[T], workers: int, is_slow: Callable[[T], bool], module: Callable[[T], str]) -> list[T]:
    """`items` reordered for `workers` work-stealing workers (unchanged for fewer than two)."""
    if workers < 2:
        return list(items)
    slow_modules: dict[str, list[T]] = {}
    fast: list[T] = []
    for item in items:
        if is_slow(item):
            slow_modules.setdefault(module(item), []).append(item)
        else:
            fast.append(item)
    shares: list[list[T]] = [[] for _ in range(workers)]
    for tests in sorted(slow_modules.values(), key=len, reverse=True):
        min(shares, key=len).extend(tests)
    size = -(-len(items) // workers)  # each share's length, the last one's the rest
    rest = iter(fast)
    for share in shares[:-1]:
        share.extend(itertools.islice(rest, max(0, size - len(share))))  # fewer when the fast ones run out
    shares[-1].extend(rest)
    return [item for share in shares for item in share]
