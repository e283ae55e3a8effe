"""A child process of `ftplane serve` kept running: started again whenever it exits, until it is stopped.

`ftplane serve` runs the Celery worker (with beat) beside the API; were the worker to die (killed for memory, a
crash), the API would go on taking reports while nothing supervised the jobs. A child that keeps exiting soon
after its start waits longer each time (doubling up to `MAX_DELAY_S`), one that ran `HEALTHY_AFTER_S` starts
again at once.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Sequence

from ftplane.terminal import err

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
HEALTHY_AFTER_S = 60.0


class RestartingChild:
    """`command` run as a child process, started again when it exits, until `stop`."""

    def __init__(self, command: Sequence[str], name: str, preexec_fn: Callable[[], None] | None = None) -> None:
        self.command = list(command)
        self.name = name
        self.preexec_fn = preexec_fn
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._process = self._start()
        self._watcher = threading.Thread(target=self._watch, name=f"ftplane-keep-{name}", daemon=True)
        self._watcher.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop the child (SIGTERM, then SIGKILL after `grace_s`); it is not started again."""
        with self._lock:
            self._stopping.set()
            process = self._process
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        self._watcher.join(timeout=grace_s)

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command, preexec_fn=self.preexec_fn)

    def _watch(self) -> None:
        delay = FIRST_DELAY_S
        while True:
            started = time.monotonic()
            code = self._process.wait()
            if self._stopping.is_set():
                return
            if time.monotonic() - started >= HEALTHY_AFTER_S:
                delay = FIRST_DELAY_S
            err.print(f"[yellow]the {self.name} exited with code {code}; starting it again in {delay:g} s[/yellow]")
            if self._stopping.wait(delay):
                return
            with self._lock:
                if self._stopping.is_set():
                    return
                self._process = self._start()
            delay = min(2 * delay, MAX_DELAY_S)
