"""Accounting of a device shared by memory: a sharer holds (and pays for) its share of it."""

from __future__ import annotations

from segue.scheduler.accounting import rates_of
from segue.store.pool import AllocationRecord, DeviceRecord, HostPool

GIB = 2**30
HOST = HostPool("h", cpus=4.0, memory=64 * GIB, source="configured",
                devices=(DeviceRecord("h", 0, "NVIDIA H100 80GB HBM3", 80 * GIB, False),), updated_at=0.0)


def alloc(gpu_memory: int | None) -> AllocationRecord:
    return AllocationRecord(1, "h", "/home", "r", "s", 1, (0,), 1.0, 0, 100, True, 0.0, 9e9, None, None, 0,
                            gpu_memory=gpu_memory)


def test_a_whole_holder_counts_the_device_and_a_sharer_its_share() -> None:
    assert rates_of(alloc(None), HOST) == {"h100": 1.0, "cpu": 1.0}
    assert rates_of(alloc(20 * GIB), HOST) == {"h100": 0.25, "cpu": 1.0}
    # Two sharers that fill the device together pay exactly one device.
    assert rates_of(alloc(40 * GIB), HOST)["h100"] * 2 == 1.0
