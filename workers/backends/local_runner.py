"""Runs one local attempt's launcher and records its exit code on disk.

`python -m workers.backends.local_runner STATE_DIR -- COMMAND...` starts COMMAND (its output to STATE_DIR/output.log),
waits for it, and writes STATE_DIR/exit_code atomically, so the outcome
survives a restart of the worker that launched it. Standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    state_dir = Path(argv[0])
    command = argv[argv.index("--") + 1 :]
    with open(state_dir / "output.log", "ab", buffering=0) as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = child.wait()
    tmp = state_dir / "exit_code.tmp"
    tmp.write_text(str(code))
    os.replace(tmp, state_dir / "exit_code")
    return code


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:]) == 0 else 1)
