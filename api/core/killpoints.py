"""Test-only kill points: named steps at which a process can be made to die, as if its machine did.

`kill_point("launch.started", job=...)` does nothing unless the environment variable
`FTPLANE_TEST_KILL_AT` names that point (a comma-separated list may name several). When it
does, the process appends a marker (one JSON line: the point, its pid, the time and the
context given) to the file named by `FTPLANE_TEST_KILL_LOG` (if set) and to stderr, then
SIGKILLs its whole process group: a Celery worker dies with its embedded beat, mid-step,
with nothing flushed or rolled back. Start a process that may hit one in a session of its
own, or it takes its parent's group with it.

The points, each placed where a crash must lose nothing and repeat nothing:

    launch.started     an attempt's processes were started by the backend (its trainer token
                       committed before), and the launch is not recorded yet
    reconcile.ended    the reconcile pass has ended an attempt that succeeded, in its
                       transaction, not yet committed
    webhook.posted     a webhook POST got its answer, and its outcome is not recorded yet

tests/reliability/test_crash_safety.py kills a worker at each and checks what it left. Unset
(production), a point costs one dictionary look-up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KILL_AT = "FTPLANE_TEST_KILL_AT"
KILL_LOG = "FTPLANE_TEST_KILL_LOG"


def kill_point(point: str, **context: object) -> None:
    wanted = os.environ.get(KILL_AT)
    if not wanted or point not in wanted.split(","):
        return
    marker = json.dumps({"point": point, "pid": os.getpid(), "at": time.time(), **context}, default=str)
    log = os.environ.get(KILL_LOG)
    if log:
        with open(log, "a") as f:
            f.write(marker + "\n")
            f.flush()
            os.fsync(f.fileno())
    print(f"killed at {marker}", file=sys.stderr, flush=True)
    os.killpg(os.getpgrp(), signal.SIGKILL)
