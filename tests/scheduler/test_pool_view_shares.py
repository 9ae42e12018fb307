"""`segue pool` shows every step sharing a device by memory, and the memory they leave free."""

from __future__ import annotations

from segue.cli.sched import format_pool
from segue.client.records import DeviceView
from segue.placement.policy import parse_priority
from segue.scheduler.views import pool_doc
from segue.store.pool import AllocationRecord, DeviceRecord, HostPool

GIB = 2**30
HOST = HostPool("h", cpus=8.0, memory=64 * GIB, source="configured", updated_at=0.0,
                devices=(DeviceRecord("h", 0, "virtual-0", 96 * GIB, True),
                         DeviceRecord("h", 1, "virtual-1", 96 * GIB, True)))


def alloc(i: int, run: str, dev: int, gpu_memory: int | None, since: float) -> AllocationRecord:
    return AllocationRecord(i, "h", "/home", run, "work", 1, (dev,), 1.0, 0, parse_priority("batch"), True, since, 9e9, None,
                            None, 0, gpu_memory=gpu_memory)


def test_sharers_are_all_listed_with_the_free_memory() -> None:
    doc = pool_doc(HOST, [alloc(2, "b", 0, 40 * GIB, 2.0), alloc(1, "a", 0, 40 * GIB, 1.0),
                          alloc(3, "whole", 1, None, 3.0)], {})
    shared, whole = doc["devices"]
    assert [h["run_id"] for h in shared["holders"]] == ["a", "b"]  # oldest first
    assert shared["holder"]["run_id"] == "a" and shared["free_memory"] == 16 * GIB
    assert whole["free_memory"] == 0 and [h["gpu_memory"] for h in whole["holders"]] == [None]
    lines = format_pool({**doc, "pool": "/p.db"})
    assert "shared, 16.0 GiB free: a/work 40 GiB (batch)" in lines[1] and "b/work 40 GiB" in lines[1]
    assert "whole/work (batch)" in lines[2]
    view = DeviceView.from_json(shared)
    assert view.free_memory == 16 * GIB and len(view.holders) == 2


def test_a_free_device_has_all_its_memory_free() -> None:
    (d0, d1) = pool_doc(HOST, [], {})["devices"]
    assert d0["holders"] == [] and d0["holder"] is None and d0["free_memory"] == 96 * GIB
