"""The node agent's GPU health, read through NVML: a fake NVML library stands in for the driver (CI has no GPU)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftplane.trainer.agent.gpu import GpuMonitor


@dataclass
class _XidEvent:
    device: str
    eventData: int  # noqa: N815 - NVML's field name


@dataclass
class FakeNvml:
    """The part of pynvml the monitor calls, for `devices` GPUs; Xid events and ECC counts set by the test."""

    devices: int = 2
    ecc: list[int] = field(default_factory=lambda: [3, 0])  # uncorrected errors since the driver loaded
    throttle: list[int] = field(default_factory=lambda: [0, 0])
    pending_xids: list[_XidEvent] = field(default_factory=list)
    fail_init: bool = False

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8  # noqa: N815

    def nvmlInit(self) -> None:  # noqa: N802
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.devices

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:  # noqa: N802
        return f"gpu{i}"

    def nvmlDeviceGetTotalEccErrors(self, handle: str, kind: int, counter: int) -> int:  # noqa: N802
        return self.ecc[int(handle[3:])]

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return object()

    def nvmlDeviceRegisterEvents(self, handle: str, kinds: int, events: object) -> None:  # noqa: N802
        pass

    def nvmlEventSetWait(self, events: object, timeout_ms: int) -> _XidEvent:  # noqa: N802
        if not self.pending_xids:
            raise TimeoutError("NVML_ERROR_TIMEOUT")
        return self.pending_xids.pop(0)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: str) -> int:  # noqa: N802
        return self.throttle[int(handle[3:])]


def test_a_healthy_node_then_new_ecc_errors_then_a_critical_xid() -> None:
    nvml = FakeNvml()
    monitor = GpuMonitor(nvml)
    devices = monitor.read()
    assert [d.as_dict() for d in devices] == [
        {"index": 0, "xid_errors": [], "ecc_uncorrected": 3, "throttled": []},
        {"index": 1, "xid_errors": [], "ecc_uncorrected": 0, "throttled": []},
    ]
    assert monitor.unhealthy_reason(devices) is None  # GPU 0's 3 errors were there before the agent started

    nvml.throttle[1] = 0x40 | 0x80
    nvml.ecc[0] = 5
    devices = monitor.read()
    assert devices[1].throttled == ["hw_thermal", "hw_power_brake"]
    assert monitor.unhealthy_reason(devices) == "GPU 0: 2 new uncorrected ECC error(s)"
    assert monitor.unhealthy_facts(devices) == {"gpu": 0, "ecc_new": 2}  # what its node_unhealthy carries

    nvml.ecc[0] = 3
    nvml.pending_xids += [_XidEvent("gpu1", 79), _XidEvent("gpu1", 48)]
    devices = monitor.read()
    assert devices[1].xid_errors == [79, 48]
    assert monitor.unhealthy_reason(devices) == "GPU 1: critical Xid error(s) [79, 48]"
    assert monitor.unhealthy_facts(devices) == {"gpu": 1, "xid": [79, 48]}


def test_without_a_driver_there_is_nothing_to_read_and_the_node_counts_as_healthy() -> None:
    for nvml in (FakeNvml(fail_init=True), FakeNvml(devices=0)):
        monitor = GpuMonitor(nvml)
        assert not monitor.available and monitor.read() == [] and monitor.unhealthy_reason([]) is None


def test_nvml_missing_entirely_is_the_same(monkeypatch: Any) -> None:
    import ftplane.trainer.agent.gpu as gpu

    monkeypatch.setattr(gpu, "_load_nvml", lambda: None)
    assert GpuMonitor().read() == []


def test_application_xids_are_the_ranks_failure_not_the_nodes() -> None:
    """Finding 3: any critical Xid marked the node unhealthy (a spare spent, the node excluded). NVIDIA's device
    plugin treats 13, 31, 43, 45, 68 (and 109) as the application's errors: the node stays healthy, and the Xid goes
    into the cause of the failure of the rank on that GPU."""
    from ftplane.trainer.agent.gpu import application_xid_facts

    nvml = FakeNvml()
    monitor = GpuMonitor(nvml)
    nvml.pending_xids += [_XidEvent("gpu1", 31), _XidEvent("gpu1", 43), _XidEvent("gpu0", 13)]
    devices = monitor.read()
    assert monitor.unhealthy_reason(devices) is None and all(d.xid_errors == [] for d in devices)
    facts = application_xid_facts(monitor, 1)  # the failure of the rank on GPU 1: its event's details gain these
    assert facts == {"xid": [31, 43], "gpu": 1, "xid_error": "Xid 31, 43 on GPU 1 (an application error)"}
    assert application_xid_facts(monitor, 1) == {}  # attributed once
    nvml.pending_xids.append(_XidEvent("gpu0", 79))  # fallen off the bus: the node's
    assert monitor.unhealthy_reason(monitor.read()) == "GPU 0: critical Xid error(s) [79]"
