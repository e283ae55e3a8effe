"""Opt-in helper: NVRx's straggler detection for a run, its score sent with the rank's heartbeats.

    detection = sdk.straggler_detection(run)            # on every rank, after init_process_group
    for step in range(start, steps):
        with detection.section("forward-backward"):     # NVRx times the section's CUDA kernels and CPU time
            loss = train_step(...)
        run.step(step + 1)                              # sends this rank's latest NVRx score with the heartbeat
    detection.close()

NVRx ships it as `nvidia_resiliency_ext.attribution.straggler` (0.5 on) and `nvidia_resiliency_ext.straggler`
(before; 0.4.1 is what CPU machines install): the same `Detector` API. Each rank gets a report of its own
(`gather_on_rank0=False`) every `report_interval_s`, generated in step on all ranks (a collective); the score
sent is the lowest of the rank's relative scores in it (its GPU kernels' and each section's, 1 = as fast as
the best rank, NVRx flags under 0.75). The control plane takes the lower of that and its own score
(api/services/stragglers.py).

NVRx's detector needs CUDA as shipped (its CUPTI extension: `initialize()` raises ImportError for libcupti
elsewhere). Without CUDA or NVRx the helper says so once and does without: `section()` still times the
rank's own work for `compute_s` (the control plane's own detection, which works everywhere), and no score
is sent. A section must hold the rank's own work only (no collective inside), as for `Run.compute()`.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

from ftplane.trainer.sdk.run import Run

log = logging.getLogger("ftplane.trainer.sdk")

DETECTOR_MODULES = ("nvidia_resiliency_ext.attribution.straggler", "nvidia_resiliency_ext.straggler")


def load_detector() -> Any | None:
    """NVRx's `Detector` class, from whichever module the installed version has; None without NVRx."""
    for name in DETECTOR_MODULES:
        try:
            return importlib.import_module(name).Detector
        except ImportError:
            continue
    return None


def rank_score(report: Any, rank: int) -> float | None:
    """The lowest relative performance score of `rank` in an NVRx report (GPU and sections), None if it has none."""
    scores: list[Any] = [(getattr(report, "gpu_relative_perf_scores", None) or {}).get(rank)]
    sections: Mapping[str, Mapping[int, float]] = getattr(report, "section_relative_perf_scores", None) or {}
    scores += [per_rank.get(rank) for per_rank in sections.values()]
    finite = [float(s) for s in scores if isinstance(s, int | float) and math.isfinite(s)]
    return min(1.0, max(0.0, min(finite))) if finite else None


class StragglerDetection:
    """NVRx's detector around a run's sections, or the run's own timing alone where NVRx cannot run."""

    def __init__(
        self,
        run: Run,
        *,
        report_interval_s: float = 60.0,
        profiling_interval: int = 1,
        cuda: bool | None = None,
        detector: Any | None = None,
    ) -> None:
        self.run = run
        self.detector: Any | None = None
        if cuda is None:
            cuda = _cuda_available()
        found = detector if detector is not None else load_detector()
        if found is None:
            log.info("NVRx straggler detection is not installed: timing sections for compute_s only")
        elif not cuda:
            log.info("NVRx straggler detection needs CUDA: timing sections for compute_s only")
        else:
            try:
                found.initialize(
                    scores_to_compute="all",
                    gather_on_rank0=False,  # each rank gets its own scores, for its own heartbeats
                    profiling_interval=profiling_interval,
                    report_time_interval=report_interval_s,
                )
                self.detector = found
            except (ImportError, OSError, RuntimeError) as exc:  # e.g. libcupti missing
                log.warning("NVRx straggler detection could not start (%s): timing sections only", exc)
        run.add_step_hook(self._report)

    @property
    def active(self) -> bool:
        """Whether NVRx's detector runs (else only the run's own section timing)."""
        return self.detector is not None

    @contextlib.contextmanager
    def section(self, name: str, *, profile_cuda: bool = True) -> Iterator[None]:
        """A section of this rank's own work: timed for `compute_s`, and by NVRx where it runs."""
        with self.run.compute():
            if self.detector is None:
                yield
                return
            with self.detector.detection_section(name, profile_cuda=profile_cuda):
                yield

    def _report(self) -> None:
        """Each step, on every rank (NVRx synchronizes the report's interval across ranks)."""
        if self.detector is None:
            return
        report = self.detector.generate_report_if_interval_elapsed()
        if report is not None:
            score = rank_score(report, self.run.rank)
            if score is not None:
                self.run.perf_score = score

    def close(self) -> None:
        self.run.remove_step_hook(self._report)
        if self.detector is not None:
            self.detector.shutdown()
            self.detector = None


def straggler_detection(run: Run | None = None, **options: Any) -> StragglerDetection:
    """The helper for `run` (default: this process's run, made from the environment if need be)."""
    if run is None:
        from ftplane.trainer.sdk.process_run import init

        run = init()
    return StragglerDetection(run, **options)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
