"""The straggler bucket: the time a job ran slower than its own healthy pace while a rank straggled.

An episode runs from its onset (its `straggler_detected` time less `onset_s`: the first pass in the window
that found the rank slow) to its end (the `straggler_cleared` of the same episode, less `recovered_s`: the
last pass that found it slow; else the end of wall time). While it runs the job loses the episode's
`lost_fraction` of its time: the straggler's extra seconds per step over the job's seconds per step then
(api/services/stragglers/episodes.py). Overlapping episodes lose the largest of their fractions, not the sum:
the ranks of a synchronous job wait for the slowest one alone.

That share of the productive time inside an episode is relabelled `straggler` (at the start of each stretch);
no other bucket is touched, so the buckets still partition wall time.
"""

from __future__ import annotations

from collections.abc import Sequence

from api.schemas.events import EventType
from api.services.goodput.attempts import PRODUCTIVE, Clock, Interval
from api.services.goodput.records import Record

Span = tuple[float, float, float]  # [begin, end) in seconds since the wall start, and the fraction of it lost


def episode_spans(recs: Sequence[Record], t: Clock, wall: float) -> list[Span]:
    """Each straggler episode's [onset, end) and the fraction of the job's time it cost."""
    ends: dict[str, float] = {}
    for r in recs:
        if r.type == EventType.straggler_cleared and isinstance(episode := r.details.get("episode"), str):
            ends[episode] = t(r.ts) - max(0.0, r.number("recovered_s") or 0.0)
    spans = []
    for r in recs:
        if r.type != EventType.straggler_detected:
            continue
        fraction = r.number("lost_fraction")
        if fraction is None or fraction <= 0:
            continue
        begin = max(0.0, t(r.ts) - max(0.0, r.number("onset_s") or 0.0))
        episode = r.details.get("episode")
        end = ends.get(episode, wall) if isinstance(episode, str) else wall
        if end > begin:
            spans.append((begin, end, min(1.0, fraction)))
    return spans


def carve_stragglers(intervals: Sequence[Interval], spans: Sequence[Span]) -> list[Interval]:
    """The intervals with each episode's share of the productive time inside it relabelled `straggler`."""
    if not spans:
        return list(intervals)
    points = sorted({b for b, _, _ in spans} | {e for _, e, _ in spans})

    def lost(lo: float, hi: float) -> float:
        mid = (lo + hi) / 2
        return max((f for b, e, f in spans if b <= mid < e), default=0.0)

    out: list[Interval] = []
    for b, e, bucket in intervals:
        if bucket != PRODUCTIVE or e <= b:
            out.append((b, e, bucket))
            continue
        cuts = [b, *(p for p in points if b < p < e), e]
        for lo, hi in zip(cuts, cuts[1:], strict=False):
            take = (hi - lo) * lost(lo, hi)
            if take > 0:
                out.append((lo, lo + take, "straggler"))
            if lo + take < hi:
                out.append((lo + take, hi, PRODUCTIVE))
    return out
