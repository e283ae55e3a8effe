"""What the node agent's exit status says to its backend (ftplane/contract.py), from how its launcher ended."""

from __future__ import annotations

from ftplane import contract


def exit_status(code: int, *, unhealthy: bool, verdict: str | None, signalled: int) -> int:
    """The agent's exit status for a launcher that ended with `code` (negative: killed by that signal).

    - the node was found unhealthy: NODE_UNHEALTHY, whatever the launcher did;
    - NVRx decided not to restart (exit 93, or its progress tracker said so in the launcher's output and the
      launcher then exited otherwise): VERDICT;
    - killed by a signal: 128 + its number, as a shell says;
    - told to stop (`signalled`: SIGTERM from the kubelet, a cancel) while the ranks then ended well:
      128 + that signal: the node was stopped, it did not finish (a pod that exits 0 would count as a
      Succeeded index of the Job);
    - otherwise the launcher's own code.
    """
    if unhealthy:
        return contract.NODE_UNHEALTHY
    if code == contract.VERDICT or (code != 0 and verdict is not None):
        return contract.VERDICT
    if code < 0:
        return 128 - code
    if code == 0 and signalled:
        return 128 + signalled
    return code
