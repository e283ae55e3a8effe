"""GPU health on this node, read with NVML (the `nvidia-ml-py` package) where it is installed.

Per device: critical Xid errors seen since the agent started (NVML's event set), uncorrected ECC
errors (volatile: since the driver loaded), and whether the clocks are throttled for a hardware
reason (thermal, power brake, HW slowdown). A device is unhealthy when it shows a critical Xid that is
not an application's error, or more uncorrected ECC errors than when the agent started. Without NVML
(no GPU, no library) there is nothing to read and the node counts as healthy.

Some critical Xids are the program's doing, not the GPU's: NVIDIA's device plugin ignores them for health
(k8s-device-plugin, internal/rm/health.go: 13 Graphics Engine Exception, 31 GPU memory page fault, 43 GPU
stopped processing, 45 preemptive cleanup after earlier errors, 68 video processor exception, and in recent
versions 109 context switch timeout; https://docs.nvidia.com/deploy/xid-errors/). Those (APPLICATION_XIDS)
never mark the node unhealthy: they are kept per device until the agent attributes them to the failure of
the rank on that device (`take_application_xids`), whose cause names them.
"""

from __future__ import annotations

import importlib
import logging
import threading
import warnings
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

# nvmlClocksThrottleReasons that mean the hardware is slowing itself down.
HW_THROTTLE = {
    0x0000000000000008: "hw_slowdown",
    0x0000000000000020: "sw_thermal",
    0x0000000000000040: "hw_thermal",
    0x0000000000000080: "hw_power_brake",
}


@dataclass(frozen=True)
class DeviceHealth:
    index: int
    xid_errors: list[int]
    ecc_uncorrected: int
    throttled: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "xid_errors": self.xid_errors,
            "ecc_uncorrected": self.ecc_uncorrected,
            "throttled": self.throttled,
        }


class GpuMonitor:
    def __init__(self, nvml: Any | None = None) -> None:
        self.nvml: Any = nvml if nvml is not None else _load_nvml()
        self.handles: list[Any] = []
        self.baseline_ecc: list[int] = []
        self.xids: dict[int, list[int]] = {}  # the node's: device -> critical Xids that blame the GPU
        self.application_xids: dict[int, list[int]] = {}  # device -> the program's Xids, not attributed yet
        self._events: Any = None
        self._lock = threading.Lock()
        if self.nvml is None:
            return
        try:
            self.nvml.nvmlInit()
            count = self.nvml.nvmlDeviceGetCount()
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.baseline_ecc = [self._ecc(h) for h in self.handles]
            self._events = self.nvml.nvmlEventSetCreate()
            for handle in self.handles:
                self.nvml.nvmlDeviceRegisterEvents(handle, self.nvml.nvmlEventTypeXidCriticalError, self._events)
        except Exception as exc:  # no GPU driver here: nothing to watch
            log.info("GPU health is not read: NVML did not start (%s)", exc)
            self.handles = []

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _ecc(self, handle: Any) -> int:
        try:
            return int(
                self.nvml.nvmlDeviceGetTotalEccErrors(
                    handle, self.nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, self.nvml.NVML_VOLATILE_ECC
                )
            )
        except Exception:  # ECC not supported on this device
            return 0

    def _drain_xids(self) -> None:
        with self._lock:
            while True:
                try:
                    data = self.nvml.nvmlEventSetWait(self._events, 0)
                except Exception:  # a timeout: no event pending
                    return
                index = next((i for i, h in enumerate(self.handles) if h == data.device), -1)
                xid = int(data.eventData)
                kept = self.application_xids if xid in APPLICATION_XIDS else self.xids
                kept.setdefault(index, []).append(xid)

    def take_application_xids(self, device: int) -> list[int]:
        """The application Xids seen on `device` since last taken (a rank on it failed: they are its cause's)."""
        if not self.available:
            return []
        self._drain_xids()
        with self._lock:
            return self.application_xids.pop(device, [])

    def read(self) -> list[DeviceHealth]:
        if not self.available:
            return []
        self._drain_xids()
        devices = []
        for i, handle in enumerate(self.handles):
            try:
                reasons = int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle))
            except Exception:
                reasons = 0
            throttled = [name for bit, name in HW_THROTTLE.items() if reasons & bit]
            devices.append(DeviceHealth(i, list(self.xids.get(i, [])), self._ecc(handle), throttled))
        return devices

    def unhealthy_reason(self, devices: list[DeviceHealth]) -> str | None:
        facts = self.unhealthy_facts(devices)
        if facts is None:
            return None
        if "xid" in facts:
            return f"GPU {facts['gpu']}: critical Xid error(s) {facts['xid']}"
        return f"GPU {facts['gpu']}: {facts['ecc_new']} new uncorrected ECC error(s)"

    def unhealthy_facts(self, devices: list[DeviceHealth]) -> dict[str, Any] | None:
        """What makes the node unhealthy, as the facts its node_unhealthy carries (the control plane reads these,
        never the sentence): the first unhealthy GPU, and its critical Xids or its new uncorrected ECC errors."""
        for device in devices:
            if device.xid_errors:
                return {"gpu": device.index, "xid": list(device.xid_errors)}
            baseline = self.baseline_ecc[device.index] if device.index < len(self.baseline_ecc) else 0
            if device.ecc_uncorrected > baseline:
                return {"gpu": device.index, "ecc_new": device.ecc_uncorrected - baseline}
        return None


def application_xid_facts(gpus: GpuMonitor, local_rank: int) -> dict[str, Any]:
    """What a rank's failure cause gains from the application Xids its GPU (the one of its local rank) raised: the
    Xids, the GPU, and that they are the program's error (no reason to blame the node)."""
    xids = gpus.take_application_xids(local_rank)
    if not xids:
        return {}
    listed = ", ".join(str(x) for x in xids)
    return {"xid": xids, "gpu": local_rank, "xid_error": f"Xid {listed} on GPU {local_rank} (an application error)"}


def _load_nvml() -> Any | None:
    try:
        with warnings.catch_warnings():  # an old `pynvml` wrapper package warns about itself on import
            warnings.simplefilter("ignore", FutureWarning)
            return importlib.import_module("pynvml")
    except ImportError:
        return None
