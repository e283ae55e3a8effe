"""GPU health on this node, read with NVML (the `nvidia-ml-py` package) where it is installed.

Per device: critical Xid errors seen since the agent started (NVML's event set), uncorrected ECC
errors (volatile: since the driver loaded), and whether the clocks are throttled for a hardware
reason (thermal, power brake, HW slowdown). A device is unhealthy when it shows a critical Xid or
more uncorrected ECC errors than when the agent started. Without NVML (no GPU, no library) there
is nothing to read and the node counts as healthy.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

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
        self.xids: dict[int, list[int]] = {}
        self._events: Any = None
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
        while True:
            try:
                data = self.nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # a timeout: no event pending
                return
            index = next((i for i, h in enumerate(self.handles) if h == data.device), -1)
            self.xids.setdefault(index, []).append(int(data.eventData))

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
        for device in devices:
            if device.xid_errors:
                return f"GPU {device.index}: critical Xid error(s) {device.xid_errors}"
            baseline = self.baseline_ecc[device.index] if device.index < len(self.baseline_ecc) else 0
            if device.ecc_uncorrected > baseline:
                return f"GPU {device.index}: {device.ecc_uncorrected - baseline} new uncorrected ECC error(s)"
        return None


def _load_nvml() -> Any | None:
    try:
        with warnings.catch_warnings():  # an old `pynvml` wrapper package warns about itself on import
            warnings.simplefilter("ignore", FutureWarning)
            return importlib.import_module("pynvml")
    except ImportError:
        return None
