"""Stragglers: the ranks that keep a job slow, found from the ranks' own reports, once per episode.

    scoring.py  one pass's scores: each rank's pace against the median of the others (pure)
    window.py   the window between passes, the episodes, their straggler_detected / straggler_cleared events

The duty that runs a pass per job and carries out `resiliency.stragglers.action` is
workers/supervision/detect_stragglers.py; the time episodes cost is goodput's `straggler` bucket
(api/services/goodput/stragglers.py).
"""

from api.services.stragglers.episodes import Episode
from api.services.stragglers.scoring import RankRow, RankScore, Scores, score_ranks
from api.services.stragglers.window import Pass, close, end_watch, observe

__all__ = ["Episode", "Pass", "RankRow", "RankScore", "Scores", "close", "end_watch", "observe", "score_ranks"]
