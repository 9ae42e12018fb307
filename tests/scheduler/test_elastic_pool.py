"""Elastic allocations in the host pool and partial preemption in the victim choice.

The policy is tested with made-up holders; the pool on a real SQLite file.
The whole path (controllers, coordinators, sub-workers) is in
test_elastic_steps.py.
"""

from __future__ import annotations

from pathlib import Path

from segue import Flow
from segue.placement.policy import Capacity, Device, Holder, Need, choose_victims, step_need
from segue.scheduler.accounting import mean_rates, rates_of
from segue.store.hostpool import SQLiteHostPool
from segue.store.pool import Allocated, AllocationRecord

GB = 2**30


def alloc(devices: tuple[int, ...], per_worker: int | None, min_gpus: int | None,
          revoke: tuple[int, ...] = ()) -> AllocationRecord:
    return AllocationRecord(1, "h", "/home", "r", "s", 1, devices, 0.0, 0, 0, True, 0.0, 9e9, None,
                            None, 0, None, per_worker, min_gpus, revoke)


def test_surplus_groups_are_the_sub_workers_above_min_last_first() -> None:
    assert alloc((0, 1, 2), 1, 1).surplus_groups() == [(2,), (1,)]
    assert alloc((0, 1, 2), 1, 1, revoke=(2,)).surplus_groups() == [(1,)]
    assert alloc((0, 1, 2), 1, 2, revoke=(2,)).surplus_groups() == []
    assert alloc((0, 1, 2, 3), 2, 2).surplus_groups() == [(2, 3)]
    assert alloc((0, 1, 2), None, None).surplus_groups() == []  # not elastic: only whole


def holder(run: str, prio: int, devices: tuple[int, ...], *, lost: float = 10.0,
           partial: str | None = None) -> Holder:
    return Holder(run, prio, True, tuple(Device(i, 80 * GB) for i in devices), 0.0, 0, lost, 0,
                  partial=partial)


def elastic(run: str, prio: int, devices: tuple[int, ...], keep: int) -> list[Holder]:
    """A run's whole candidate plus one partial candidate per spare sub-worker."""
    spare = [holder(run, prio, (d,), lost=0.0, partial="embed") for d in reversed(devices[keep:])]
    return [holder(run, prio, devices), *spare]


NONE_FREE = Capacity((), 8.0, 64 * GB)


def test_an_urgent_one_gpu_step_takes_a_spare_sub_worker_not_the_whole_run() -> None:
    victims = choose_victims(Need(gpus=1), NONE_FREE, elastic("a", 0, (0, 1, 2), 1), 300)
    assert victims is not None and len(victims) == 1
    assert victims[0].partial == "embed" and [d.index for d in victims[0].devices] == [2]


def test_more_than_the_spare_devices_pauses_the_whole_run_and_no_partial() -> None:
    victims = choose_victims(Need(gpus=3), NONE_FREE, elastic("a", 0, (0, 1, 2), 1), 300)
    assert victims is not None and [(v.run_id, v.partial) for v in victims] == [("a", None)]


def test_at_equal_priority_a_spare_sub_worker_goes_before_a_run_with_nothing_to_lose() -> None:
    holders = [holder("b", 0, (3,), lost=0.0), *elastic("a", 0, (0, 1, 2), 1)]
    victims = choose_victims(Need(gpus=1), NONE_FREE, holders, 300)
    assert victims is not None and [(v.run_id, v.partial) for v in victims] == [("a", "embed")]


def test_two_spares_of_one_run_for_a_two_gpu_step() -> None:
    victims = choose_victims(Need(gpus=2), NONE_FREE, elastic("a", 0, (0, 1, 2), 1), 300)
    assert victims is not None and {v.partial for v in victims} == {"embed"}
    assert sorted(d.index for v in victims for d in v.devices) == [1, 2]


def test_step_need_of_an_elastic_step_is_its_min_sub_workers_devices() -> None:
    flow = Flow("f")

    @flow.map(source=[1], sink=[], workers=(2, 4), gpus=1)  # type: ignore[arg-type]
    def emb(r):  # noqa: ANN001, ANN202
        return r

    need = step_need(flow.steps, "emb")
    assert (need.gpus, need.per_worker) == (2, 1)
    fixed = Flow("g")

    @fixed.map(source=[1], sink=[], workers=3, gpus=2)  # type: ignore[arg-type]
    def emb2(r):  # noqa: ANN001, ANN202
        return r

    need = step_need(fixed.steps, "emb2")
    assert (need.gpus, need.per_worker) == (6, 0)  # per sub-worker, but not resizable


def pool_of(tmp_path: Path, gpus: int) -> SQLiteHostPool:
    pool = SQLiteHostPool(tmp_path / "pool.db")
    pool.configure_host("h", cpus=8, memory=64 * GB, devices=[(f"virtual-{i}", 80 * GB, True)
                                                              for i in range(gpus)], source="configured")
    return pool


def test_grow_revoke_shrink_keep_a_history_without_double_holders(tmp_path: Path) -> None:
    pool = pool_of(tmp_path, 4)
    need = Need(gpus=1, per_worker=1)
    a = pool.allocate("/home", "r", "s", host="h", need=need, priority=0, preemptible=True, ttl_s=60)
    assert isinstance(a, Allocated) and pool.bind(a.id, 1, 60)
    assert pool.grow("/home", "r", "s", 1, gpus=1, max_gpus=3) == (1,)
    assert pool.grow("/home", "r", "s", 1, gpus=2, max_gpus=3) == (2,)  # capped at max
    assert pool.grow("/home", "r", "s", 1, gpus=1, max_gpus=3) == ()
    # Growth never takes what a waiting run could use.
    pool.upsert_request("/home", "u", "x", host="h", need=Need(gpus=1), priority=300,
                        reason="waiting", ttl_s=60)
    assert pool.grow("/home", "r", "s", 1, gpus=1, max_gpus=4) == ()
    pool.drop_requests("/home", "u")

    assert pool.revoke("/home", "r", [2]) is True
    live = pool.allocation("/home", "r", "s", 1)
    assert live is not None and live.devices == (0, 1, 2) and live.revoke == (2,)
    assert pool.free_capacity("h").devices[0].index == 3  # promised, still held until shrunk
    after = pool.shrink("/home", "r", "s", 1, [2])
    assert after is not None and after.devices == (0, 1) and after.revoke == ()
    # A zombie of an older epoch cannot resize the live allocation.
    assert pool.shrink("/home", "r", "s", 0, [0]) is None
    assert pool.grow("/home", "r", "s", 0, gpus=1, max_gpus=4) == ()

    history = pool.allocation_history(after.id)
    assert [h.devices for h in history] == [(0,), (0, 1), (0, 1, 2), (0, 1)]
    every = pool.list_allocations("h", live_only=False)
    for d in range(4):
        spans = sorted((r.since, r.released_at or 9e18) for r in every if d in r.devices)
        assert all(s2 >= e1 for (_, e1), (s2, _) in zip(spans, spans[1:], strict=False)), \
            (d, spans)

    released = pool.release("/home", "r", "s", 1)
    assert released is not None and released.parent is not None
    end = released.released_at or 0.0
    rates = mean_rates(pool.allocation_history(released.id), pool.get_host("h"), end)
    assert 0 < sum(rates.values()) <= 3
    assert rates_of(history[0], pool.get_host("h")) == {"virtual": 1.0}
