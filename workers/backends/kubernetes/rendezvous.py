"""How an attempt's ft_launchers meet and stop: the rendezvous settings and the stop grace, from the spec.

The c10d rendezvous store lives in the ft_launcher of the pod of completion index 0 (`rendezvous_host`): the
other pods reach it by its stable DNS name. Pods of one attempt may start minutes apart (a node Karpenter is
still launching, a 20 GB image to pull, an FSx volume to mount), and NVRx gives up on a rendezvous after
`join_timeout` (300 s by default in NVRx 0.7's LaunchConfig) and on reaching the store after
`store_connect_wait_seconds` (120 s): those launchers exit as if they had crashed. Both are set from the spec
(JOIN_TIMEOUT: the pending timeout, else the initial heartbeat timeout, never less than NVRx's 300 s).

The store host's own node is special: when it is lost, every launcher loses the store, and the whole attempt
ends although a hot spare stands by (NVRx 0.7: "If this is the store host, the TCPStore will die when this
process exits, effectively terminating the rendezvous", fault_tolerance/launcher.py). NVRx 0.7 lets a launcher
be told whether it hosts the store (`--rdzv-conf is_host=true|false`) and wait for a store that starts after
it (`store_connect_wait_seconds`), but every launcher still connects to the one endpoint it is given, and the
store lives inside the launcher that hosts it: it cannot run apart from a training node without a process of
ftplane's own serving NVRx's barrier keys. So index 0 keeps hosting it, and losing its node is a job restart
without that node, spares or not: the lost store host is the cause, blamed and excluded alone (failures.py;
the other launchers' exits are its consequences), the spare's node and the other nodes are neither blamed nor
excluded, and the job restarts with fresh spares (docs: deploy/README.md, "The rendezvous store's node").

When a pod is told to stop (SIGTERM: an eviction, a drain, Karpenter, a cancel), the node agent passes it to
ft_launcher, which passes it to the ranks (`--term-timeout`: SIGKILL only after `resiliency.stop_grace_s`); a
loop using the SDK learns of it (`run.should_stop()`, trainer/sdk/termination.py) and saves, as the built-in
trainer does. The pod's
terminationGracePeriodSeconds is that grace plus the agent's time to send its last report (`contract.exit_flush_s`,
longer for a job whose size lengthens its report interval) and leave.
"""

from __future__ import annotations

import math

from api.schemas.spec import JobSpec
from ftplane import contract

NVRX_JOIN_TIMEOUT_S = 300  # NVRx 0.7's LaunchConfig default
AGENT_EXIT_S = 10  # the node agent's exit after its last report (contract.exit_flush_s)


def join_timeout_s(spec: JobSpec) -> int:
    """How long a launcher waits for the others to join the rendezvous (and for the store to come up)."""
    waited = spec.resiliency.pending_timeout_s or spec.resiliency.initial_heartbeat_timeout_s
    return int(max(NVRX_JOIN_TIMEOUT_S, waited))


def launcher_flags(spec: JobSpec) -> list[str]:
    """ft_launcher's flags for the rendezvous and for stopping (NVRx 0.4.1 and later accept them)."""
    join = join_timeout_s(spec)
    return [
        f"--rdzv-conf=join_timeout={join},store_connect_wait_seconds={join}",
        f"--term-timeout={spec.resiliency.stop_grace_s}",
    ]


def termination_grace_s(spec: JobSpec) -> int:
    """The pods' terminationGracePeriodSeconds."""
    return spec.resiliency.stop_grace_s + math.ceil(contract.exit_flush_s(spec.report_interval_s)) + AGENT_EXIT_S
