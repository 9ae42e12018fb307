"""The resource-pool contract, run against every store backend."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _store_helpers import make_run

from segue.scheduler.policy import Need
from segue.states import Actor, TaskState
from segue.store import SQLiteStore
from segue.store.pool import Denied, Placement

BACKENDS = ["sqlite"]
GB = 2**30
pytestmark = pytest.mark.parametrize("store", BACKENDS, indirect=True)


def pool(store, gpus=(80, 80), cpus=8.0, host="h"):
    return store.configure_host(host, cpus=cpus, memory=64 * GB,
                                devices=[(f"v{i}", m * GB, True) for i, m in enumerate(gpus)],
                                source="configured")


ONE_GPU = Need(gpus=1, cpus=1)


def start(store, run, step="train", need=ONE_GPU, prio=100, ttl=60.0, host="h"):
    return store.try_start_attempt(run, step, host=host, need=need, priority=prio, preemptible=True,
                                   ttl_s=ttl, actor=Actor.CONTROLLER)


def test_configure_and_read_host(store) -> None:
    hp = pool(store, gpus=(80, 40))
    assert [(d.index, d.memory, d.virtual) for d in hp.devices] == [(0, 80 * GB, True), (1, 40 * GB, True)]
    assert store.get_host("h") == hp and store.get_host("other") is None
    assert store.list_hosts() == [hp]
    cap = store.free_capacity("h")
    assert len(cap.devices) == 2 and cap.cpus == 8.0


def test_placement_starts_the_attempt_and_allocates(store) -> None:
    pool(store)
    make_run(store, "a")
    got = start(store, "a")
    assert isinstance(got, Placement) and got.devices == (0,)
    assert got.task.state == TaskState.RUNNING and got.task.epoch == 1
    [alloc] = store.list_allocations("h")
    assert (alloc.run_id, alloc.step, alloc.epoch, alloc.devices) == ("a", "train", 1, (0,))
    assert [d.index for d in store.free_capacity("h").devices] == [1]


def test_nothing_is_allocated_twice(store) -> None:
    pool(store, gpus=(80,))
    make_run(store, "a")
    make_run(store, "b")
    assert isinstance(start(store, "a"), Placement)
    denied = start(store, "b")
    assert isinstance(denied, Denied)
    assert denied.reason.startswith("waiting for 1 gpu, 1 cpu; free now: 0 gpus")
    assert store.get_task("b", "train").state == TaskState.PENDING  # nothing started


def test_right_fitting_by_gpu_memory(store) -> None:
    pool(store, gpus=(80, 40, 24))
    make_run(store, "a")
    got = start(store, "a", need=Need(gpus=1, gpu_memory=30 * GB))
    assert got.devices == (1,)


def test_impossible_request_says_so(store) -> None:
    pool(store, gpus=(80,))
    make_run(store, "a")
    got = start(store, "a", need=Need(gpus=2))
    assert isinstance(got, Denied) and got.reason == "needs 2 gpus but host 'h' has 1; it can never run here"


def test_release_returns_devices_and_keeps_history(store) -> None:
    pool(store, gpus=(80,))
    make_run(store, "a")
    start(store, "a")
    rel = store.release_allocation("a", "train", 1)
    assert rel is not None and rel.released_at is not None
    assert store.list_allocations("h") == []
    assert len(store.list_allocations("h", live_only=False)) == 1
    assert len(store.free_capacity("h").devices) == 1


def test_expired_lease_returns_devices_and_heartbeat_renews(store) -> None:
    pool(store, gpus=(80,))
    make_run(store, "a")
    make_run(store, "b")
    start(store, "a", ttl=0.3)
    store.heartbeat("a", "train", 1, 0.3)  # renews the allocation with the lease
    assert isinstance(start(store, "b"), Denied)
    time.sleep(0.4)  # the holder stopped heartbeating: it crashed
    got = start(store, "b")
    assert isinstance(got, Placement) and got.devices == (0,)


def test_priority_order_then_fifo_among_waiting_requests(store) -> None:
    pool(store, gpus=(80,))
    for r in ("holder", "early-batch", "late-urgent", "late-batch"):
        make_run(store, r)
    start(store, "holder")
    n = Need(gpus=1, cpus=1)
    store.upsert_request("early-batch", "train", host="h", need=n, priority=0, reason="x", ttl_s=60)
    time.sleep(0.01)
    store.upsert_request("late-batch", "train", host="h", need=n, priority=0, reason="x", ttl_s=60)
    store.upsert_request("late-urgent", "train", host="h", need=n, priority=300, reason="x", ttl_s=60)
    assert [r.run_id for r in store.list_requests("h")] == ["late-urgent", "early-batch", "late-batch"]
    store.release_allocation("holder", "train", 1)
    got = start(store, "late-batch", prio=0)
    assert isinstance(got, Denied) and "waiting behind run 'late-urgent'" in got.reason
    assert isinstance(start(store, "early-batch", prio=0), Denied)
    assert isinstance(start(store, "late-urgent", prio=300), Placement)
    assert [r.run_id for r in store.list_requests("h")] == ["early-batch", "late-batch"]


def test_a_refreshed_request_keeps_its_place(store) -> None:
    n = Need(gpus=1)
    a = store.upsert_request("r", "s", host="h", need=n, priority=0, reason="one", ttl_s=60)
    b = store.upsert_request("r", "s", host="h", need=n, priority=0, reason="two", ttl_s=60)
    assert a.submitted_at == b.submitted_at and b.reason == "two"
    store.drop_request("r")
    assert store.list_requests() == []


def test_stats_add_and_set(store) -> None:
    store.add_stats("r", {"device_s": 1.5, "preemptions": 1})
    store.add_stats("r", {"device_s": 2.0})
    store.set_stats("r", {"preempted_at": 5.0})
    assert store.get_stats("r") == {"device_s": 3.5, "preemptions": 1.0, "preempted_at": 5.0}


RACER = """
import json, sys, time
from segue.scheduler.policy import Need
from segue.states import Actor
from segue.store import SQLiteStore
from segue.store.pool import Placement
db, me, start_at, rounds = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
store = SQLiteStore(db)
while time.time() < start_at:
    time.sleep(0.001)
got = 0
for i in range(rounds):
    step = f"s{i}"
    res = store.try_start_attempt(me, step, host="h", need=Need(gpus=1, cpus=0.1), priority=100,
                                  preemptible=True, ttl_s=30, actor=Actor.CONTROLLER)
    if isinstance(res, Placement):
        got += 1
        time.sleep(0.002)
        store.release_allocation(me, step, res.task.epoch)
print(json.dumps({"got": got}))
"""


def test_controllers_racing_for_the_pool_never_share_a_device(store, tmp_path: Path) -> None:
    if not isinstance(store, SQLiteStore):
        pytest.skip("the racers open the SQLite file directly")
    pool(store, gpus=(80, 80))
    racers, rounds = 6, 40
    for r in range(racers):
        make_run(store, f"r{r}", steps=[f"s{i}" for i in range(rounds)])
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    start_at = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, str(script), str(store.path), f"r{r}", str(start_at),
                               str(rounds)], stdout=subprocess.PIPE, text=True) for r in range(racers)]
    got = [json.loads(p.communicate(timeout=120)[0])["got"] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    history = store.list_allocations("h", live_only=False)
    assert len(history) == sum(got) and sum(got) > 0
    # For each device, the allocation intervals never overlap.
    for dev in (0, 1):
        spans = sorted((a.since, a.released_at) for a in history if dev in a.devices)
        for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert e1 is not None and e1 <= s2, f"device {dev} allocated twice: {s1}-{e1} and {s2}"


def test_no_backfill_past_a_waiting_higher_class(store) -> None:
    pool(store, gpus=(80, 80))
    for r in ("holder", "big-urgent", "small-batch", "impossible"):
        make_run(store, r)
    start(store, "holder")  # one device busy, one free
    store.upsert_request("big-urgent", "train", host="h", need=Need(gpus=2), priority=300, reason="x", ttl_s=60)
    # A batch run that would fit in the free device must not take it: the urgent
    # run is freeing capacity for itself (it is preempting the holder).
    got = start(store, "small-batch", prio=0)
    assert isinstance(got, Denied) and "waiting behind run 'big-urgent'" in got.reason
    # A request that can never run here blocks nobody.
    store.drop_request("big-urgent")
    store.upsert_request("impossible", "train", host="h", need=Need(gpus=3), priority=300, reason="x", ttl_s=60)
    assert isinstance(start(store, "small-batch", prio=0), Placement)
