"""Phases of a rank's work that are not training steps (validation, a checkpoint save): not hangs.

Hang detection, ft_launcher's and the control plane's, hears a rank through its steps: the SDK sends a
heartbeat only for an interval in which the loop made progress. A long validation or checkpoint save
makes no steps, and past `heartbeat_timeout_s` its ranks would be killed as hung. While a phase is
open, a thread of the run keeps both kinds of heartbeat going, once per interval, at the step the
rank is at, for at most the phase's `timeout_s`: a phase that outlasts it goes silent, and a hang
inside it is then found as any other.

NVRx's own section timeouts (`RankMonitorClient.start_section`) are not used: ftplane starts
ft_launcher in heartbeat mode, and turning sections on would put every job's code outside the
sections under one more timeout of the launcher's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator

log = logging.getLogger("ftplane.trainer.sdk")

DEFAULT_PHASE_TIMEOUT_S = 1800.0


class Phases:
    """The open phase of one rank, and the thread that keeps its heartbeats going meanwhile. `beat` is
    called once per `interval_s` while a phase is open (it re-sends the newest heartbeat)."""

    def __init__(self, beat: Callable[[], None], *, interval_s: float) -> None:
        self._beat = beat
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._name: str | None = None
        self._until = 0.0
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def current(self) -> str | None:
        """The open phase's name (None between phases, and once a phase outlasted its timeout)."""
        with self._lock:
            return self._name if self._name is not None and time.monotonic() < self._until else None

    def begin(self, name: str, timeout_s: float | None = None) -> None:
        """Open phase `name` (closing the one open, if any); its heartbeats stop after `timeout_s`."""
        bound = DEFAULT_PHASE_TIMEOUT_S if timeout_s is None else timeout_s
        with self._lock:
            self._name, self._until = name, time.monotonic() + bound
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._run, name="ftplane-sdk-phases", daemon=True)
                self._thread.start()
        self._wake.set()

    @contextlib.contextmanager
    def open(self, name: str, timeout_s: float | None = None) -> Iterator[None]:
        self.begin(name, timeout_s)
        try:
            yield
        finally:
            self.end()

    def end(self) -> None:
        with self._lock:
            self._name = None

    def close(self) -> None:
        self._stopping = True
        self._wake.set()

    def _run(self) -> None:
        warned: str | None = None
        while not self._stopping:
            with self._lock:
                name, until = self._name, self._until
            if name is not None and time.monotonic() < until:
                try:
                    self._beat()
                except Exception:  # the keep-alive must not die: the phase would look like a hang
                    log.exception("keeping the heartbeats of phase %s going failed", name)
            elif name is None:
                warned = None
            elif warned != name:
                warned = name
                log.warning("phase %s outlasted its timeout: its heartbeats stop (a hang is detected as usual)", name)
            self._wake.wait(self.interval_s)
            self._wake.clear()
