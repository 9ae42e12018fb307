"""Scheduling policy with made-up facts and times (no clock, no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from segue.errors import UsageError
from segue.placement.policy import (
    Capacity,
    Device,
    Holder,
    Need,
    choose_victims,
    default_preemptible,
    effective_priority,
    fit_devices,
    parse_priority,
    place,
)

GB = 2**30


def cap(*mems: int, cpus: float = 8, memory: int = 64 * GB, start: int = 0) -> Capacity:
    return Capacity(tuple(Device(start + i, m * GB) for i, m in enumerate(mems)), cpus, memory)


def holder(run: str, prio: int, devs: list[tuple[int, int]], lost: float = 0.0, pre: int = 0,
           preemptible: bool = True) -> Holder:
    return Holder(run, prio, preemptible, tuple(Device(i, m * GB) for i, m in devs), 1.0, 0, lost, pre)


def test_priorities() -> None:
    assert parse_priority("urgent") > parse_priority("high") > parse_priority("normal") > parse_priority("batch")
    assert parse_priority(" Batch ") == 0 and parse_priority("150") == 150 and parse_priority(7) == 7
    with pytest.raises(UsageError, match=r"^priority 'asap' is unknown; use one of urgent, high, normal, batch or an integer$"):
        parse_priority("asap")
    assert default_preemptible(parse_priority("batch")) and not default_preemptible(parse_priority("urgent"))


def test_right_fitting_takes_the_smallest_big_enough_devices() -> None:
    free = cap(80, 40, 24, 141).devices
    assert fit_devices(free, 1, 30 * GB) == [1]  # 40 GB, not 80 or 141
    assert fit_devices(free, 2, 30 * GB) == [0, 1]
    assert fit_devices(free, 1, 100 * GB) == [3]
    assert fit_devices(free, 2, 100 * GB) is None
    assert fit_devices(free, 0, None) == []


def test_place_checks_cpus_and_memory() -> None:
    assert place(Need(gpus=1, cpus=2), cap(80, cpus=1)) is None
    assert place(Need(gpus=1, cpus=1, memory=65 * GB), cap(80)) is None
    assert place(Need(gpus=1, cpus=1, memory=8 * GB), cap(80)) == [0]


def test_no_victims_when_it_fits() -> None:
    assert choose_victims(Need(gpus=1), cap(80), [holder("a", 0, [(1, 80)])], 300) == []


def test_victims_lowest_priority_then_least_work_lost_then_least_preempted() -> None:
    hs = [
        holder("normal", 100, [(0, 80)], lost=1.0),
        holder("batch-much-lost", 0, [(1, 80)], lost=50.0),
        holder("batch-little-lost", 0, [(2, 80)], lost=2.0, pre=3),
        holder("batch-little-lost-fresh", 0, [(3, 80)], lost=2.0, pre=0),
    ]
    got = choose_victims(Need(gpus=1), cap(), hs, 300)
    assert [v.run_id for v in got] == ["batch-little-lost-fresh"]
    got = choose_victims(Need(gpus=3), cap(), hs, 300)
    assert [v.run_id for v in got] == ["batch-little-lost-fresh", "batch-little-lost", "batch-much-lost"]


def test_only_lower_priority_preemptible_runs_are_victims() -> None:
    hs = [holder("peer", 300, [(0, 80)]), holder("pinned", 0, [(1, 80)], preemptible=False)]
    assert choose_victims(Need(gpus=1), cap(), hs, 300) is None
    assert choose_victims(Need(gpus=1), cap(), [holder("b", 100, [(0, 80)])], 100) is None


def test_unnecessary_victims_are_dropped() -> None:
    # The first candidate's device is too small for the request, so pausing it helps nobody.
    hs = [holder("small", 0, [(0, 16)], lost=0.0), holder("big", 0, [(1, 80)], lost=5.0)]
    got = choose_victims(Need(gpus=1, gpu_memory=40 * GB), cap(), hs, 300)
    assert [v.run_id for v in got] == ["big"]


def test_aging_raises_one_class_per_max_pause_up_to_high() -> None:
    assert effective_priority(0, 10.0, 0.0) == 0  # disabled
    assert effective_priority(0, 59.0, 60.0) == 0
    assert effective_priority(0, 60.0, 60.0) == 100
    assert effective_priority(0, 150.0, 60.0) == 200
    assert effective_priority(0, 10_000.0, 60.0) == 200  # capped at high
    assert effective_priority(300, 10_000.0, 60.0) == 300  # never lowers


@given(st.lists(st.tuples(st.integers(0, 300), st.floats(0, 100), st.integers(0, 5),
                          st.sampled_from([16, 40, 80])), min_size=0, max_size=6),
       st.integers(1, 4), st.sampled_from([None, 24, 60]))
def test_victims_always_make_room_and_respect_priority(specs, gpus, mem_gb) -> None:
    hs = [holder(f"r{i}", p, [(i, m)], lost=lost, pre=pre) for i, (p, lost, pre, m) in enumerate(specs)]
    need = Need(gpus=gpus, gpu_memory=None if mem_gb is None else mem_gb * GB)
    free = Capacity((), 8, 64 * GB)
    got = choose_victims(need, free, hs, 250)
    if got is None:
        return
    assert all(v.priority < 250 and v.preemptible for v in got)
    after = free
    for v in got:
        after = after.plus(v.devices, v.cpus, v.memory)
    assert place(need, after) is not None
    # Minimal: dropping any one victim no longer makes room.
    for v in got:
        rest = free
        for x in got:
            if x is not v:
                rest = rest.plus(x.devices, x.cpus, x.memory)
        assert place(need, rest) is None
