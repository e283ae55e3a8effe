"""The faults an agent carries out itself, from outside the ranks' code (the control plane's `agent` delivery).

crash      SIGKILL of the rank's process: the launcher sees it die and restarts the group
hang       SIGSTOP of the rank's process: it stops heartbeating; a launcher or the control plane
           must notice
node_loss  SIGKILL of the launcher's whole process tree and of the agent itself: the node is gone
           as far as the job can tell
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

from ftplane.contract import EventType, utcnow_iso
from ftplane.trainer.agent.processes import RankProcess, descendants, is_stopped, process_start_time
from ftplane.trainer.agent.uplink import NodeEvents

SIGNALS = {"crash": signal.SIGKILL, "hang": signal.SIGSTOP}


def signal_rank(process: RankProcess, kind: str) -> bool:
    """Send the fault's signal to the rank's process, if it is still the same process; False if not."""
    if kind not in SIGNALS or process_start_time(process.pid) != process.start_time:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, SIGNALS[kind])
        return True
    return False


def inject_signal(events: NodeEvents, process: RankProcess, kind: str, key: str, details: dict[str, Any]) -> bool:
    """Crash or hang the rank's process and report it `fault_injected`, timed just before the signal. False, and
    nothing reported, when the process has exited (or its pid is another's now): the fault did not happen, and a
    `fault_injected` would count a failure the job never had (a crash that came after the rank's last step)."""
    at = utcnow_iso()
    if not signal_rank(process, kind):
        return False
    events.event(EventType.fault_injected, rank=process.rank, key=key, details=details, ts=at)
    return True


def injected_crash_cause(rank: int, pid: int) -> dict[str, Any]:
    """The cause of a round in which this agent crashed `rank` itself (a `rank_failed` event's details)."""
    return {
        "cause": f"rank {rank} killed by SIGKILL (a crash injected by ftplane)",
        "cause_class": "crash",
        "rank": rank,
        "pid": pid,
        "signal": "SIGKILL",
        "exit_code": -9,
        "injected": True,
    }


def crash_announced(event: dict[str, Any]) -> tuple[int, int] | None:
    """(rank, pid) of a rank's `fault_injected` of kind crash: the SDK kills that rank next. The launcher logs only
    the first of a round's exits by whole seconds, often a peer's broken collective: the agent knows better."""
    details = event.get("details")
    if event.get("type") != EventType.fault_injected or not isinstance(details, dict) or details.get("kind") != "crash":
        return None
    rank, pid = event.get("rank"), details.get("pid")
    return (rank, pid) if isinstance(rank, int) and isinstance(pid, int) else None


def resume_stopped(root: int) -> None:
    """SIGCONT to every stopped process under `root`, so that a termination signal can reach it."""
    for pid in descendants(root):
        if is_stopped(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def kill_tree(root: int) -> None:
    for pid in [*reversed(descendants(root)), root]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def lose_node(launcher_pid: int) -> None:
    """Kill everything of this node at once, the agent last. Does not return."""
    kill_tree(launcher_pid)
    os.kill(os.getpid(), signal.SIGKILL)
