"""Real processes a test starts and kills: a Celery worker, run with the command line `ftplane serve` uses."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path

from ftplane.serve import Part, celery_command


def kill_group(process: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Signal the process and everything in its session (it was started with start_new_session)."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    process.wait(timeout=30)


class CeleryWorker:
    """A worker (with embedded beat unless `beat=False`) in a session of its own, so that `kill9()`
    takes beat too. Its output is appended to `log`; it runs in `log`'s directory."""

    def __init__(
        self,
        env: Mapping[str, str],
        log: Path,
        *,
        loglevel: str = "INFO",
        beat: bool = True,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.command = [*celery_command(Part.all if beat else Part.worker, loglevel), *extra_args]
        self.env = dict(env)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> CeleryWorker:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                self.command,
                env=self.env,
                cwd=self.log.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        return self

    def kill9(self) -> None:
        """SIGKILL the worker and everything it started, as when its machine dies."""
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process)
        self.process = None

    def stop(self, timeout: float = 30) -> None:
        """A warm shutdown (SIGTERM); SIGKILL after `timeout` seconds."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(self.process)
        self.process = None

    def __enter__(self) -> CeleryWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
