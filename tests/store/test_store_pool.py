"""The host pool contract, on both backends (one SQLite file shared by every home of a
machine; a PostgreSQL store's database shared by every host of a cluster), and the
home's side of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _store_helpers import make_run

from segue.placement.policy import Need
from segue.states import Actor, TaskState
from segue.store import SQLiteStore
from segue.store.hostpool import SqlHostPool, SQLiteHostPool, pool_path
from segue.store.pool import Allocated, Denied
from segue.store.pools import open_pool
from segue.store.postgres import PostgresStore
from segue.store.postgres_hostpool import PostgresHostPool

GB = 2**30
A, B = "/homes/a/.segue", "/homes/b/.segue"  # two homes sharing one pool
ONE_GPU = Need(gpus=1, cpus=1)


class FakeClock:
    """Virtual time: lease tests move it forward instead of sleeping against a lease."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def hp(request: pytest.FixtureRequest, tmp_path: Path, clock: FakeClock,
       new_target: Callable[[str], str]) -> Iterator[SqlHostPool]:
    if request.param == "sqlite":
        yield SQLiteHostPool(tmp_path / "pool.db", clock=clock)
        return
    # The database's clock, moved by the test's virtual clock (the store's test offset).
    clock.t = base = time.time()
    pool = PostgresHostPool(PostgresStore(new_target("postgres"), clock_offset=lambda: clock.t - base))
    try:
        yield pool
    finally:
        pool.close()


def configure(hp, gpus=(80, 80), cpus=8.0, host="h"):
    return hp.configure_host(host, cpus=cpus, memory=64 * GB,
                             devices=[(f"v{i}", m * GB, True) for i, m in enumerate(gpus)],
                             source="configured")


def alloc(hp, run, home=A, step="train", need=ONE_GPU, prio=100, ttl=60.0, host="h"):
    return hp.allocate(home, run, step, host=host, need=need, priority=prio, preemptible=True,
                       ttl_s=ttl)


def placed(hp, run, home=A, step="train", epoch=1, **kw):
    got = alloc(hp, run, home, step, **kw)
    assert isinstance(got, Allocated), got
    assert hp.bind(got.id, epoch, kw.get("ttl", 60.0))
    return got


def test_configure_and_read_host(hp) -> None:
    h = configure(hp, gpus=(80, 40))
    assert [(d.index, d.memory, d.virtual) for d in h.devices] == [(0, 80 * GB, True), (1, 40 * GB, True)]
    assert hp.get_host("h") == h and hp.get_host("other") is None
    cap = hp.free_capacity("h")
    assert len(cap.devices) == 2 and cap.cpus == 8.0


def test_detection_never_overwrites_a_host_configured_after_its_read(hp) -> None:
    """ensure_host reads (absent), detects, then writes with only_if_new: a `segue pool
    set` that landed in between wins, and the detected hardware is not written."""
    assert hp.get_host("h") is None  # what the detector read
    configured = configure(hp, gpus=(96,))  # the operator's configuration lands now
    got = hp.configure_host("h", cpus=2.0, memory=GB, devices=[], source="none", only_if_new=True)
    assert got == configured == hp.get_host("h")
    assert [c.actor for c in hp.pool_changes("h")] == []  # neither wrote a change record
    fresh = hp.configure_host("new", cpus=2.0, memory=GB, devices=[], source="none", only_if_new=True)
    assert hp.get_host("new") == fresh and fresh.source == "none"  # absent: written


def test_the_same_run_id_in_two_homes_is_two_holders(hp) -> None:
    configure(hp, gpus=(80,))
    got = placed(hp, "train", A)
    assert got.devices == (0,)
    denied = alloc(hp, "train", B)  # same run id, other home: the device is taken
    assert isinstance(denied, Denied) and not denied.never
    assert denied.reason.startswith("waiting for 1 gpu, 1 cpu; free now: 0 gpus")
    [a] = hp.list_allocations("h")
    assert (a.home, a.run_id, a.epoch, a.devices) == (A, "train", 1, (0,))


def test_right_fitting_by_gpu_memory(hp) -> None:
    configure(hp, gpus=(80, 40, 24))
    assert placed(hp, "a", need=Need(gpus=1, gpu_memory=30 * GB)).devices == (1,)


def test_impossible_request_says_so(hp) -> None:
    configure(hp, gpus=(80,))
    got = alloc(hp, "a", need=Need(gpus=2))
    assert isinstance(got, Denied) and got.never
    assert got.reason == "needs 2 gpus but host 'h' has 1 gpu; it can never run here"
    big = alloc(hp, "a", need=Need(gpus=1, gpu_memory=100 * GB))
    assert isinstance(big, Denied) and big.never and "0 with >= 100 GiB" in big.reason


def test_release_returns_devices_and_keeps_history(hp) -> None:
    configure(hp, gpus=(80,))
    placed(hp, "a")
    rel = hp.release(A, "a", "train", 1)
    assert rel is not None and rel.released_at is not None
    assert hp.list_allocations("h") == []
    assert len(hp.list_allocations("h", live_only=False)) == 1
    assert len(hp.free_capacity("h").devices) == 1


def test_expired_lease_returns_devices_and_renew_extends(hp, clock) -> None:
    configure(hp, gpus=(80,))
    placed(hp, "a", ttl=10)
    clock.t += 8
    assert hp.renew(A, "a", "train", 1, ttl_s=10, ckpt_at=123.0, preemptions=2)
    clock.t += 8  # past the first lease, within the renewed one
    assert isinstance(alloc(hp, "b", B), Denied)
    [a] = hp.list_allocations("h")
    assert (a.ckpt_at, a.preemptions) == (123.0, 2)  # what a preemptor chooses victims by
    clock.t += 2.5  # the holder's controller stopped renewing: it crashed
    assert not hp.renew(A, "a", "train", 1, ttl_s=10, ckpt_at=None, preemptions=0)
    assert isinstance(alloc(hp, "b", B), Allocated)


def test_an_allocation_whose_lease_lapsed_before_bind_is_refused(hp, clock) -> None:
    configure(hp, gpus=(80,))
    got = alloc(hp, "a", ttl=10)
    assert isinstance(got, Allocated)
    clock.t += 10.5  # the process stalled between allocate and starting its attempt
    assert isinstance(alloc(hp, "b", B), Allocated)  # someone else has the device now
    assert not hp.bind(got.id, 1, 60)


def test_release_of_an_unbound_allocation_by_id(hp) -> None:
    configure(hp, gpus=(80,))
    got = alloc(hp, "a")
    hp.release_id(got.id)  # starting the attempt failed: the devices return at once
    assert isinstance(alloc(hp, "b", B), Allocated)


def test_priority_order_then_fifo_among_waiting_requests_of_all_homes(hp, clock) -> None:
    configure(hp, gpus=(80,))
    placed(hp, "holder", A)
    n = Need(gpus=1, cpus=1)
    hp.upsert_request(A, "early-batch", "train", host="h", need=n, priority=0, reason="x", ttl_s=60)
    clock.t += 0.01
    hp.upsert_request(B, "late-batch", "train", host="h", need=n, priority=0, reason="x", ttl_s=60)
    hp.upsert_request(B, "late-urgent", "train", host="h", need=n, priority=300, reason="x",
                      ttl_s=60)
    assert [r.run_id for r in hp.list_requests("h")] == ["late-urgent", "early-batch", "late-batch"]
    hp.release(A, "holder", "train", 1)
    got = alloc(hp, "early-batch", A, prio=0)
    assert isinstance(got, Denied)
    assert got.reason.startswith("waiting behind run 'late-urgent' step 'train' of home /homes/b")
    assert isinstance(alloc(hp, "late-batch", B, prio=0), Denied)
    assert isinstance(alloc(hp, "late-urgent", B, prio=300), Allocated)
    assert [r.run_id for r in hp.list_requests("h")] == ["early-batch", "late-batch"]


def test_a_refreshed_request_keeps_its_place(hp) -> None:
    n = Need(gpus=1)
    a = hp.upsert_request(A, "r", "s", host="h", need=n, priority=0, reason="one", ttl_s=60)
    b = hp.upsert_request(A, "r", "s", host="h", need=n, priority=0, reason="two", ttl_s=60)
    assert a.submitted_at == b.submitted_at and b.reason == "two"
    hp.upsert_request(B, "r", "s", host="h", need=n, priority=0, reason="other home", ttl_s=60)
    hp.drop_requests(A, "r")
    assert [(r.home, r.reason) for r in hp.list_requests()] == [(B, "other home")]


def test_no_backfill_past_a_waiting_higher_class(hp) -> None:
    configure(hp, gpus=(80, 80))
    placed(hp, "holder", A)  # one device busy, one free
    hp.upsert_request(B, "big-urgent", "train", host="h", need=Need(gpus=2), priority=300,
                      reason="x", ttl_s=60)
    # A batch run that would fit in the free device must not take it: the urgent
    # run is freeing capacity for itself (it is preempting the holder).
    got = alloc(hp, "small-batch", A, prio=0)
    assert isinstance(got, Denied) and "waiting behind run 'big-urgent'" in got.reason
    # A request that can never run here blocks nobody.
    hp.drop_requests(B, "big-urgent")
    hp.upsert_request(B, "impossible", "train", host="h", need=Need(gpus=3), priority=300,
                      reason="x", ttl_s=60)
    assert isinstance(alloc(hp, "small-batch", A, prio=0), Allocated)


def test_preemption_requests_are_answered_once_and_expire(hp, clock) -> None:
    req = hp.request_preemption(A, "low", by_home=B, by_run="hi", reason="why", ttl_s=60)
    short = hp.request_preemption(A, "low", by_home=B, by_run="hi2", reason="why", ttl_s=5)
    assert [r.id for r in hp.pending_preemptions(A, "low")] == [req.id, short.id]
    assert hp.pending_preemptions(B, "low") == []  # another home's run of the same name
    hp.answer_preemption(req.id, "accepted")
    hp.answer_preemption(req.id, "refused: too late")  # the first answer stands
    got = hp.preemption(req.id)
    assert got is not None and got.outcome == "accepted"
    clock.t += 5.5
    assert hp.pending_preemptions(A, "low") == []  # the preemptor stopped waiting for an answer


def test_parked_runs_of_every_home(hp) -> None:
    hp.park(A, "low")
    hp.park(B, "low")
    hp.park(A, "low")  # idempotent
    assert hp.parked() == [(A, "low"), (B, "low")]
    hp.unpark(A, "low")
    assert hp.parked() == [(B, "low")]


def test_pool_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_POOL", str(tmp_path / "x" / "p.db"))
    assert pool_path() == tmp_path / "x" / "p.db"
    assert open_pool().path == tmp_path / "x" / "p.db"  # its directory is created
    monkeypatch.delenv("SEGUE_POOL")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    shared = Path("/var/lib/segue")
    if os.geteuid() == 0 or (shared.is_dir() and os.access(shared, os.W_OK)):
        assert pool_path() == shared / "pool.db"
    else:
        assert pool_path() == tmp_path / "state" / "segue" / "pool.db"


def test_configuration_changes_are_recorded_with_their_actor(hp, clock) -> None:
    configure(hp, gpus=(80,))  # no actor (a host detected at first use): nothing recorded
    assert hp.pool_changes() == []
    hp.configure_host("h", cpus=4.0, memory=64 * GB, devices=[("v0", 40 * GB, True)] * 2,
                      source="configured", actor="api:alice")
    clock.t += 5
    hp.configure_host("other", cpus=2.0, memory=GB, devices=[], source="none", actor="cli")
    newest, first = hp.pool_changes()
    assert (newest.host, newest.actor) == ("other", "cli")
    assert newest.time == pytest.approx(clock.t, abs=2)  # PostgreSQL: its clock, a moment later
    assert newest.change["before"] is None and newest.change["after"]["gpus"] == 0
    assert (first.host, first.actor) == ("h", "api:alice") and first.user
    assert newest.time - first.time == pytest.approx(5, abs=1)
    assert first.change == {
        "before": {"source": "configured", "cpus": 8.0, "memory": 64 * GB, "gpus": 1,
                   "gpu_memory": [80 * GB], "virtual": 1},
        "after": {"source": "configured", "cpus": 4.0, "memory": 64 * GB, "gpus": 2,
                  "gpu_memory": [40 * GB], "virtual": 2}}
    assert hp.pool_changes("h") == [first] and hp.pool_changes(limit=1) == [newest]
    # A name that looks like SQL is only a value (bound parameters).
    hp.configure_host("h", cpus=4.0, memory=GB, devices=[], source="configured", actor="x'); DROP TABLE hosts;--")
    assert hp.pool_changes("h")[0].actor == "x'); DROP TABLE hosts;--" and hp.get_host("h") is not None


def test_a_pool_of_schema_1_gains_the_change_log(tmp_path: Path) -> None:
    import sqlite3

    from segue.store import hostpool

    path = tmp_path / "pool.db"
    conn = sqlite3.connect(path)  # a pool file written by the segue before pool changes
    for stmt in hostpool._SCHEMA:
        conn.execute(stmt)
    conn.execute("INSERT INTO hosts VALUES ('h', 8, 0, 'configured', 1)")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    hp = SQLiteHostPool(path)
    assert hp.get_host("h") is not None and hp.pool_changes() == []  # kept, and the table is there
    hp.configure_host("h", cpus=8.0, memory=0, devices=[], source="configured", actor="cli")
    assert [c.actor for c in hp.pool_changes()] == ["cli"]
    # Migrated all the way: through schema 3 (the change log) to the newest.
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == hostpool.VERSION >= 3


def test_a_newer_pool_schema_is_refused(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "pool.db"
    SQLiteHostPool(path)  # creates it
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(Exception, match="from a newer segue"):
        SQLiteHostPool(path)


# -- the home's side ------------------------------------------------------------
def test_placed_attempt_starts_and_clears_the_local_request(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "segue.db")
    make_run(store, "a")
    store.upsert_request("a", "train", host="h", need=ONE_GPU, priority=0, reason="waiting",
                         ttl_s=60)
    [req] = store.list_requests()
    assert req.home == str(tmp_path) and req.reason == "waiting"
    task = store.start_placed_attempt("a", "train", ttl_s=60, actor=Actor.CONTROLLER,
                                      data={"devices": [0], "host": "h"})
    assert task.state == TaskState.RUNNING and task.epoch == 1
    assert store.list_requests() == []
    started = [e for e in store.list_events("a") if e.to_state == TaskState.RUNNING]
    assert started[-1].data["devices"] == [0]


def test_stats_add_and_set(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "segue.db")
    store.add_stats("r", {"device_s": 1.5, "preemptions": 1})
    store.add_stats("r", {"device_s": 2.0})
    store.set_stats("r", {"preempted_at": 5.0})
    assert store.get_stats("r") == {"device_s": 3.5, "preemptions": 1.0, "preempted_at": 5.0}


RACER = """
import json, sys, time
from segue.placement.policy import Need
from segue.store.pools import open_pool
from segue.store.pool import Allocated
db, home, me, start_at, rounds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
pool = open_pool(db)  # a pool file, or a PostgreSQL URL
while time.time() < start_at:
    time.sleep(0.001)
got = 0
for i in range(rounds):
    res = pool.allocate(home, me, f"s{i}", host="h", need=Need(gpus=1, cpus=0.1), priority=100,
                        preemptible=True, ttl_s=30)
    if isinstance(res, Allocated):
        assert pool.bind(res.id, 1, 30)
        got += 1
        time.sleep(0.002)
        pool.release(home, me, f"s{i}", 1)
print(json.dumps({"got": got}))
"""


def test_controllers_of_many_homes_racing_never_share_a_device(hp, tmp_path: Path) -> None:
    configure(hp, gpus=(80, 80))
    racers, rounds = 6, 40
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    start_at = time.time() + 1.5
    # Every racer is a run called "r" of its own home.
    procs = [subprocess.Popen([sys.executable, str(script), str(hp.path), f"/homes/{r}", "r",
                               str(start_at), str(rounds)], stdout=subprocess.PIPE, text=True)
             for r in range(racers)]
    got = [json.loads(p.communicate(timeout=120)[0])["got"] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    history = hp.list_allocations("h", live_only=False)
    assert len(history) == sum(got) and sum(got) > 0
    assert len({a.home for a in history}) > 1
    # For each device, the allocation intervals never overlap.
    for dev in (0, 1):
        spans = sorted((a.since, a.released_at) for a in history if dev in a.devices)
        for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
            assert e1 is not None and e1 <= s2, f"device {dev} allocated twice: {s1}-{e1} and {s2}"


def test_homes_share_devices_but_budget_cpus_each(hp) -> None:
    configure(hp, gpus=(80,), cpus=4.0)
    placed(hp, "cpu-heavy", A, need=Need(cpus=4))
    # Home A's cpus are all allocated; home B budgets its own share of the cores.
    assert isinstance(alloc(hp, "more", A, need=Need(cpus=1)), Denied)
    assert isinstance(alloc(hp, "cpu-b", B, need=Need(cpus=4)), Allocated)
    assert hp.free_capacity("h", A).cpus == 0.0 and len(hp.free_capacity("h", B).devices) == 1
    placed(hp, "gpu-a", A, step="fit", need=Need(gpus=1))
    assert hp.free_capacity("h", B).devices == ()  # the device is the machine's
    # A CPU-only urgent request of home B does not hold back home A's CPU work,
    # but a GPU one holds back GPU work of every home.
    hp.release(A, "cpu-heavy", "train", 1)
    hp.upsert_request(B, "urgent-cpu", "s", host="h", need=Need(cpus=8), priority=300,
                      reason="x", ttl_s=60)
    assert isinstance(alloc(hp, "batch-cpu", A, need=Need(cpus=1), prio=0), Allocated)
    hp.release(A, "gpu-a", "fit", 1)
    hp.upsert_request(B, "urgent-gpu", "s", host="h", need=Need(gpus=1), priority=300,
                      reason="x", ttl_s=60)
    got = alloc(hp, "batch-gpu", A, need=Need(gpus=1), prio=0)
    assert isinstance(got, Denied) and "waiting behind run 'urgent-gpu'" in got.reason


def test_a_home_made_again_at_the_same_path_can_bind_its_epochs_again(hp, clock) -> None:
    # `rm -rf .segue` and the same --run-id: epochs start over at 1 under the same key.
    configure(hp, gpus=(80, 80, 80))
    first = placed(hp, "nightly", A, epoch=1)
    hp.release(A, "nightly", "train", 1)
    again = placed(hp, "nightly", A, epoch=1)
    assert again.id != first.id
    rows = hp.list_allocations("h", live_only=False)
    assert sorted(r.epoch for r in rows) == [-first.id, 1]
    # A holder that is still live keeps its key: the newcomer's bind fails, nothing raises.
    lapsed = placed(hp, "other", B, epoch=1, ttl=5.0)
    clock.t += 10.0  # lapsed's lease ran out without a release
    live = placed(hp, "other", B, epoch=1)
    assert live.id != lapsed.id
    clash = alloc(hp, "other", B)
    assert isinstance(clash, Allocated) and not hp.bind(clash.id, 1, 60.0)
