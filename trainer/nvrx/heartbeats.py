"""ft_launcher's in-job restart and hang detection (NVRx's fault_tolerance): each rank sends heartbeats
over IPC to its rank monitor; a rank silent for `--ft-rank-heartbeat-timeout` is killed and the worker
group restarted. Only active under ft_launcher (it sets FT_RANK_MONITOR_IPC_SOCKET).

A heartbeat is a round trip to the monitor process, so the SDK sends them from a thread of its own, one
per interval in which the loop made progress (`ProgressHeartbeats`): a hung loop still goes silent, and a
slow monitor never holds up a step.
"""

from __future__ import annotations

import logging
import os
import threading

from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

log = logging.getLogger(__name__)

FT_RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"


class HeartbeatClient:
    """One heartbeat per step to this rank's ft_launcher rank monitor (a no-op outside ft_launcher)."""

    def __init__(self) -> None:
        self.enabled = bool(os.environ.get(FT_RANK_MONITOR_ENV))
        self._client: RankMonitorClient | None = None
        self._broken = False

    def connect(self) -> None:
        """(Re)connect at the start of every training iteration, as NVRx's examples do."""
        if not self.enabled:
            return
        self.close()
        try:
            self._client = RankMonitorClient()
            self._client.init_workload_monitoring()
            self._broken = False
        except Exception as exc:
            # Training goes on; hang detection by ft_launcher does not (the launcher logs it too).
            log.error("cannot connect to the ft_launcher rank monitor (%s); no NVRx heartbeats", exc)
            self._client = None

    @property
    def connected(self) -> bool:
        return self._client is not None and self._client.is_initialized

    def beat(self) -> None:
        if self._client is None or self._broken:
            return
        try:
            self._client.send_heartbeat()
        except Exception as exc:
            self._broken = True
            log.error("NVRx heartbeat failed (%s); no more heartbeats this iteration", exc)

    def close(self) -> None:
        if self._client is not None and self._client.is_initialized:
            try:
                self._client.shutdown_workload_monitoring()
            except Exception as exc:
                log.debug("rank monitor shutdown: %s", exc)
        self._client = None


class ProgressHeartbeats:
    """ft_launcher's rank heartbeats for a loop that must never wait on them.

    The loop calls `progress()` once per step (an integer increment, nothing else). A daemon thread
    owns the `HeartbeatClient`: it connects (again at each `reconnect()`, i.e. at each entry of the
    training function, as NVRx's examples do), then sends one heartbeat per `interval_s` in which
    the loop progressed. A hung loop progresses no more, so the rank monitor hears nothing and
    ft_launcher restarts the group after --ft-rank-heartbeat-timeout, as with a heartbeat sent by
    the loop itself, at most `interval_s` later. Until the first step after a (re)connect the
    launcher's initial timeout applies (model build, checkpoint load).
    """

    def __init__(self, interval_s: float = 0.25, client: HeartbeatClient | None = None) -> None:
        self.client = client if client is not None else HeartbeatClient()
        self.enabled = self.client.enabled
        self.interval_s = interval_s
        self._progress = 0
        self._connects = 1 if self.enabled else 0  # connect requests; the thread connects on each new one
        self._stopping = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="ftplane-nvrx-heartbeats", daemon=True)
            self._thread.start()

    @property
    def connected(self) -> bool:
        return self.client.connected

    def progress(self) -> None:
        """The loop made progress (called on the training thread: O(1), no I/O)."""
        self._progress += 1

    def reconnect(self) -> None:
        """Connect again (a new training iteration): the launcher's initial timeout applies anew."""
        if self.enabled:
            self._connects += 1
            self._wake.set()

    def close(self, timeout: float = 2.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                return  # stuck on the monitor: a daemon thread, it ends with the process
        self.client.close()

    def _run(self) -> None:
        connected_for, sent = 0, 0
        while not self._stopping:
            if self._connects != connected_for:
                connected_for = self._connects
                self.client.connect()
                sent = self._progress  # the initial timeout runs until the next step
            elif self._progress != sent:
                sent = self._progress
                self.client.beat()
            self._wake.wait(self.interval_s)
            self._wake.clear()
