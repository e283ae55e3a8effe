"""The agent's exit status: what the backends read to decide what a finished node means.

0                   the launcher finished and the node is healthy
VERDICT (93)        ft_launcher's own: NVRx decided not to restart (no progress over
                    --ft-max-no-progress-cycles, or its attribution said stop). The job fails,
                    no job-level restart is made.
NODE_UNHEALTHY (94) this node must not be used again: GPU errors, a failed health check, or a
                    rank asked to exclude it. The backend blames the node: a job restart with
                    the node excluded.
anything else       the launcher's own exit status (its in-job restarts are spent)
"""

from __future__ import annotations

VERDICT = 93
NODE_UNHEALTHY = 94
