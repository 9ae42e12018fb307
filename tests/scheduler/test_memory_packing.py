"""Memory-aware right fitting: steps that declare ``gpu_memory`` share a device while
their memory fits; preemption frees memory, not only whole devices; ``accelerator=``
hints match the pool's device types.

The placement function is tested with made-up capacities; the pool file with two
real processes racing; the whole path with real controllers and workers on
virtual GPUs, held by gates so that no outcome depends on timing.
"""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from segue_helpers import FLOWS, Segue, wait_for
from test_preemption import expected_acc

from segue import Flow
from segue.placement.policy import (
    Capacity,
    Device,
    Holder,
    Need,
    canonical_accelerator,
    choose_victims,
    device_kind,
    fit_devices,
    place,
    step_need,
    wait_reason,
)
from segue.store import hostpool
from segue.store.hostpool import SQLiteHostPool, never_fits
from segue.store.pool import Allocated, Denied

GB = 2**30
GATED = str(FLOWS / "gpugate.py")


def dev(i: int, mem_gb: int, free_gb: float | None = None, sharers: int = 0, kind: str = "") -> Device:
    return Device(i, mem_gb * GB, None if free_gb is None else int(free_gb * GB), sharers, kind)


def cap(*devices: Device) -> Capacity:
    return Capacity(tuple(devices), 8.0, 64 * GB)


def mem(gb: int, gpus: int = 1, accelerator: str | None = None) -> Need:
    return Need(gpus=gpus, gpu_memory=gb * GB, accelerator=accelerator)


# -- placement, as a pure function ---------------------------------------------------
def test_best_fit_puts_a_sharer_where_it_leaves_the_least_memory_free() -> None:
    # gpu 0: 96 GB empty; gpu 1: 96 GB with 50 free; gpu 2: 48 GB empty.
    free = cap(dev(0, 96), dev(1, 96, 50, sharers=1), dev(2, 48))
    assert place(mem(40), free) == [2]  # leaves 8 GB (gpu 1 would leave 10, gpu 0 56)
    assert place(mem(49), free) == [1]  # leaves 1 GB; the empty 96 GB device stays empty
    assert place(mem(60), free) == [0]  # only the empty big one is big enough
    assert place(mem(40, gpus=2), free) == [1, 2]
    assert place(mem(97), free) is None


def test_a_whole_step_takes_the_smallest_device_nobody_uses() -> None:
    free = cap(dev(0, 96), dev(1, 96, 90, sharers=1), dev(2, 48))
    assert place(Need(gpus=1), free) == [2]
    assert place(Need(gpus=2), free) == [0, 2]
    assert place(Need(gpus=3), free) is None  # gpu 1 has a sharer: never held whole with it


def test_exclusive_holders_and_sharers_never_mix() -> None:
    # A device held whole is not in the capacity at all: a sharer cannot use it.
    assert place(mem(1), cap()) is None
    # A device with a sharer, even a tiny one, is not whole.
    assert place(Need(gpus=1), cap(dev(0, 96, 95, sharers=1))) is None
    assert place(mem(40), cap(dev(0, 96, 95, sharers=1))) == [0]


def test_placement_never_oversubscribes_memory() -> None:
    free = cap(dev(0, 96, 16, sharers=2))
    assert place(mem(16), free) == [0]  # exactly full is fine
    assert place(Need(gpus=1, gpu_memory=16 * GB + 1), free) is None


@given(st.lists(st.integers(1, 100), max_size=12), st.lists(st.sampled_from([24, 48, 96]), min_size=1,
                                                              max_size=3))
def test_packing_in_any_order_never_exceeds_a_device(sizes_gb, devices_gb) -> None:
    total = {i: m * GB for i, m in enumerate(devices_gb)}
    used = dict.fromkeys(total, 0)
    users = dict.fromkeys(total, 0)
    for size in sizes_gb:
        free = cap(*(Device(i, total[i], total[i] - used[i], users[i]) for i in total))
        got = place(mem(size), free)
        fitting = [i for i in total if total[i] - used[i] >= size * GB]
        assert (got is None) == (not fitting)  # it fits whenever some device has room
        if got is not None:
            [i] = got
            best = min(total[j] - used[j] - size * GB for j in fitting)
            assert total[i] - used[i] - size * GB == best  # and goes where it fits most tightly
            used[i] += size * GB
            users[i] += 1
        assert all(used[i] <= total[i] for i in total)


def test_accelerator_hints_match_device_types() -> None:
    assert canonical_accelerator("rtx-pro-6000") == "rtx-pro-6000-blackwell"
    assert canonical_accelerator("NVIDIA RTX PRO 6000") == "rtx-pro-6000-blackwell"
    assert canonical_accelerator("H100") == "h100"
    # Real devices are typed by the catalog; typed virtual ones by their name.
    assert device_kind("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96 * GB, False) == \
        "rtx-pro-6000-blackwell"
    assert device_kind("rtx-pro-6000-blackwell", 96 * GB, True) == "rtx-pro-6000-blackwell"
    assert device_kind("virtual-0", 80 * GB, True) == "virtual"
    free = cap(dev(0, 96, kind="rtx-pro-6000-blackwell"), dev(1, 24, kind="l4"),
               dev(2, 80, kind="a100-80gb"))
    assert fit_devices(free.devices, 1, None, "l4") == [1]
    assert fit_devices(free.devices, 1, 20 * GB, canonical_accelerator("rtx-pro-6000")) == [0]
    assert fit_devices(free.devices, 1, 40 * GB, "l4") is None  # the l4 is too small
    assert fit_devices(free.devices, 1, None, "a100") == [2]  # a family name matches its sizes
    assert fit_devices(free.devices, 1, None, "h100") is None
    assert fit_devices(free.devices, 1, None, None) == [1]  # no hint: any type, smallest first


def test_a_step_declares_gpu_memory_and_accelerator() -> None:
    flow = Flow("f")

    @flow.step(gpus=1, gpu_memory="40GiB", accelerator="rtx-pro-6000")
    def infer(ctx): ...

    @flow.step(gpus=1)
    def train(ctx): ...

    need = step_need(flow.steps, "infer")
    assert need == Need(gpus=1, gpu_memory=40 * GB, cpus=1.0, accelerator="rtx-pro-6000-blackwell")
    assert need.shares and not step_need(flow.steps, "train").shares
    # --gpu-mem on the run makes every GPU step a sharer of that size.
    assert step_need(flow.steps, "train", gpu_memory_override=20 * GB).gpu_memory == 20 * GB
    from segue.errors import FlowError

    with pytest.raises(FlowError, match=r"^step 'bad': accelerator must be a device type"):
        @flow.step(gpus=1, accelerator="  ")
        def bad(ctx): ...


def test_waiting_reason_names_memory() -> None:
    free = cap(dev(0, 96, 16, sharers=2), dev(1, 24, 4, sharers=1))
    assert wait_reason(mem(40), free) == "waiting for 40 GiB on 1 gpu (best free: 16 GiB on gpu 0)"
    assert wait_reason(mem(40, gpus=2), free) == (
        "waiting for 40 GiB on each of 2 gpus (best free: 16 GiB on gpu 0)")
    assert wait_reason(mem(40), cap()) == "waiting for 40 GiB on 1 gpu (every gpu is held whole)"


def _h(run: str, prio: int, shares: list[tuple[int, int]], lost: float = 0.0,
       whole: tuple[Device, ...] = ()) -> Holder:
    return Holder(run, prio, True, whole, 0.0, 0, lost, 0, shares=tuple((i, g * GB) for i, g in shares))


def test_preemption_takes_as_many_sharers_as_the_memory_needs() -> None:
    free = cap(dev(0, 96, 16, sharers=2))
    a, b = _h("a", 0, [(0, 40)], lost=1.0), _h("b", 0, [(0, 40)], lost=5.0)
    assert choose_victims(mem(40), free, [a, b], 300) == [a]
    assert choose_victims(mem(50), free, [a, b], 300) == [a]  # 16 + 40 = 56 >= 50
    assert {v.run_id for v in choose_victims(mem(60), free, [a, b], 300) or []} == {"a", "b"}
    assert choose_victims(Need(gpus=1), free, [a, b], 300) is not None  # a whole step: both go
    assert choose_victims(mem(97), free, [a, b], 300) is None


def test_victims_are_chosen_on_one_device_not_spread() -> None:
    # gpu 0: a (least work lost) and c; gpu 1: b alone. A 60 GB step frees one device:
    # taking a alone frees 40 + 16 on gpu 0 (not enough); b alone frees gpu 1 whole.
    free = cap(dev(0, 96, 16, sharers=2), dev(1, 96, 26, sharers=1))
    a, c = _h("a", 0, [(0, 40)], lost=1.0), _h("c", 0, [(0, 40)], lost=9.0)
    b = _h("b", 0, [(1, 70)], lost=5.0)
    assert choose_victims(mem(60), free, [a, b, c], 300) == [b]
    # A lower class is paused before a higher one, even if that takes more victims.
    n = _h("n", 100, [(1, 70)], lost=0.0)
    got = choose_victims(mem(60), free, [a, c, n], 300)
    assert got is not None and {v.run_id for v in got} == {"a", "c"}


def test_an_exclusive_victim_frees_its_device_for_a_sharer() -> None:
    free = cap(dev(1, 24, 0, sharers=1))  # gpu 0 (96 GB) is held whole by w
    w = _h("w", 0, [], whole=(dev(0, 96),))
    assert choose_victims(mem(40), free, [w], 300) == [w]


def test_never_fits_names_the_types_the_pool_has(tmp_path: Path) -> None:
    pool = SQLiteHostPool(tmp_path / "p.db")
    hp = pool.configure_host("h", cpus=8, memory=64 * GB, source="configured", devices=[
        ("rtx-pro-6000-blackwell", 96 * GB, True), ("l4", 24 * GB, True), ("l4", 24 * GB, True)])
    assert never_fits(mem(40, accelerator="rtx-pro-6000-blackwell"), hp) is None
    assert never_fits(Need(gpus=1, accelerator="h100"), hp) == (
        "needs 1 h100 gpu but host 'h' has 2 l4, 1 rtx-pro-6000-blackwell; it can never run here")
    assert never_fits(mem(40, accelerator="l4"), hp) == (
        "needs 40 GiB on 1 l4 gpu but host 'h' has 2 l4 gpus, 0 with >= 40 GiB; it can never run here")
    assert never_fits(mem(100), hp) == (
        "needs 100 GiB on 1 gpu but host 'h' has 3 gpus, 0 with >= 100 GiB; it can never run here")


# -- the pool file -----------------------------------------------------------------
def _pool96(path: Path) -> SQLiteHostPool:
    pool = SQLiteHostPool(path)
    pool.configure_host("h", cpus=8, memory=64 * GB, source="configured",
                        devices=[("virtual-0", 96 * GB, True)])
    return pool


def _alloc(pool: SQLiteHostPool, run: str, need: Need, prio: int = 100) -> Allocated | Denied:
    return pool.allocate("/home/a", run, "s", host="h", need=need, priority=prio, preemptible=True,
                         ttl_s=60)


def test_the_pool_packs_sharers_and_keeps_them_apart_from_whole_holders(tmp_path: Path) -> None:
    pool = _pool96(tmp_path / "p.db")
    assert isinstance(a := _alloc(pool, "a", mem(40)), Allocated) and a.devices == (0,)
    assert isinstance(_alloc(pool, "b", mem(40)), Allocated)
    third = _alloc(pool, "c", mem(40))
    assert isinstance(third, Denied) and not third.never
    assert third.reason == "waiting for 40 GiB on 1 gpu (best free: 16 GiB on gpu 0)"
    whole = _alloc(pool, "w", Need(gpus=1))
    assert isinstance(whole, Denied) and whole.reason.startswith("waiting for 1 gpu; free now: 0 gpus")
    assert [(x.run_id, x.devices, x.gpu_memory) for x in pool.list_allocations("h")] == [
        ("a", (0,), 40 * GB), ("b", (0,), 40 * GB)]
    assert pool.free_capacity("h").devices == (Device(0, 96 * GB, 16 * GB, 2, "virtual"),)
    pool.release_id(a.id)
    pool.release_id(pool.list_allocations("h")[0].id)
    assert isinstance(w := _alloc(pool, "w", Need(gpus=1)), Allocated)  # empty again: whole
    assert isinstance(_alloc(pool, "c", mem(1)), Denied)
    pool.release_id(w.id)
    assert isinstance(_alloc(pool, "c", mem(96)), Allocated)


def test_a_pool_of_schema_2_gains_memory_columns_and_old_holders_stay_whole(tmp_path: Path) -> None:
    path = tmp_path / "pool.db"
    conn = sqlite3.connect(path)  # a pool file written by the segue before memory sharing
    for stmt in hostpool._SCHEMA + hostpool._SCHEMA_V2:
        conn.execute(stmt)
    conn.execute("INSERT INTO hosts VALUES ('h', 8, 0, 'configured', 1)")
    conn.execute("INSERT INTO devices VALUES ('h', 0, 'virtual-0', ?, 1)", (96 * GB,))
    conn.execute("INSERT INTO allocations (host, home, run_id, step, epoch, devices, cpus, memory,"
                 " priority, preemptible, since, lease_until) VALUES ('h', '/old', 'old', 's', 1,"
                 " '[0]', 1, 0, 100, 1, 1, 9e12)")
    conn.execute("INSERT INTO requests VALUES ('/old', 'w', 's', 'h', 100, 1, NULL, 1, 0, 1, 'x',"
                 " 9e12)")
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()
    pool = SQLiteHostPool(path)
    [old] = pool.list_allocations("h")
    assert old.run_id == "old" and old.gpu_memory is None  # held whole, as it was
    assert isinstance(_alloc(pool, "a", mem(1)), Denied)  # so nobody shares its device
    [req] = pool.list_requests("h")
    assert req.need.accelerator is None and req.need.gpus == 1
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == hostpool.VERSION >= 3


def _racer(path: str, barrier, whole: bool, rounds: int, out, me: int) -> None:  # a child process
    pool = SQLiteHostPool(path)
    need = Need(gpus=1) if whole else Need(gpus=1, gpu_memory=40 * GB)
    barrier.wait()  # start together: the most contention, not a condition of the result
    got = 0
    for i in range(rounds):
        res = pool.allocate(f"/home/{me}", "r", f"s{i}", host="h", need=need,
                            priority=100, preemptible=True, ttl_s=60)
        if isinstance(res, Allocated):
            got += 1
            pool.release_id(res.id)
    out.put(got)


def test_processes_racing_for_memory_never_oversubscribe_a_device(tmp_path: Path) -> None:
    path = tmp_path / "pool.db"
    pool = _pool96(path)
    # Each racer is its own process and connection; three share, one wants the device whole.
    ctx = mp.get_context("spawn")
    kinds = [False, False, False, True]
    barrier, out = ctx.Barrier(len(kinds)), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(str(path), barrier, whole, 40, out, i))
             for i, whole in enumerate(kinds)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    history = pool.list_allocations("h", live_only=False)
    assert len(history) == sum(got) > 0
    # Replay the history: at no instant do live sharers exceed 96 GB, or share with a whole holder.
    edges = sorted([(a.since, 1, a) for a in history] + [(a.released_at or 0.0, 0, a) for a in history],
                   key=lambda e: (e[0], e[1]))
    live: list = []
    for _, opening, a in edges:
        if not opening:
            live.remove(a)
            continue
        live.append(a)
        assert sum(x.gpu_memory or 0 for x in live) <= 96 * GB, live
        assert len(live) == 1 or all(x.gpu_memory is not None for x in live), live


def test_three_racing_for_one_device_exactly_two_share_it(tmp_path: Path) -> None:
    path = tmp_path / "pool.db"
    pool = _pool96(path)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_hold_one, args=(str(path), barrier, f"r{i}", out)) for i in range(3)]
    for p in procs:
        p.start()
    got = sorted(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got == [False, True, True]
    assert sorted(a.gpu_memory or 0 for a in pool.list_allocations("h")) == [40 * GB, 40 * GB]


def _hold_one(path: str, barrier, run: str, out) -> None:  # runs in a child process
    pool = SQLiteHostPool(path)
    barrier.wait()
    res = pool.allocate("/home/x", run, "s", host="h", need=Need(gpus=1, gpu_memory=40 * GB),
                        priority=100, preemptible=True, ttl_s=600)
    out.put(isinstance(res, Allocated))


# -- real runs ---------------------------------------------------------------------
def _setup_96(segue: Segue) -> None:
    proc = segue("pool", "set", "--gpus", "1", "--gpu-mem", "96GiB", "--cpus", "8")
    assert proc.returncode == 0, proc.stderr


def _gated(segue: Segue, run: str, priority: str, gate: Path) -> None:
    segue("run", GATED, "--detach", "--run-id", run, "--priority", priority, "--gpu-mem", "40GiB",
          "-p", f"gate={gate}", check=True)


def _holding(segue: Segue, run: str) -> bool:
    s = segue.step(run, "hold")
    return s["state"] == "RUNNING" and bool(s["pid"]) and s["last_checkpoint"] is not None


def _exact(segue: Segue, run: str) -> dict:
    out = segue.output(run, "hold")
    assert out["ticks"] > 0 and out["acc"] == expected_acc(out["ticks"])  # nothing lost or repeated
    return out


def _live(segue: Segue) -> dict[str, tuple[tuple[int, ...], int | None]]:
    home = str(segue.home.resolve())
    pool = SQLiteHostPool(segue.env["SEGUE_POOL"])
    return {a.run_id: (a.devices, a.gpu_memory) for a in pool.list_allocations() if a.home == home}


def _never_over(segue: Segue) -> None:
    """From the pool's whole history: device 0 never held more than 96 GB at once."""
    history = SQLiteHostPool(segue.env["SEGUE_POOL"]).list_allocations(live_only=False)
    for a in history:
        at = a.since
        live = [x for x in history if x.since <= at and (x.released_at is None or x.released_at > at)]
        assert sum(x.gpu_memory or 96 * GB for x in live) <= 96 * GB, live


def test_two_40gb_steps_share_a_96gb_device_and_the_third_waits(segue: Segue, tmp_path: Path) -> None:
    gates = {r: tmp_path / f"gate-{r}" for r in ("a", "b", "c")}
    _setup_96(segue)
    _gated(segue, "a", "normal", gates["a"])
    _gated(segue, "b", "normal", gates["b"])
    wait_for(lambda: _holding(segue, "a") and _holding(segue, "b"), 120, "a and b to run at once")
    # Both hold the same device at the same time, 40 GB each, from the pool itself.
    assert _live(segue) == {"a": ((0,), 40 * GB), "b": ((0,), 40 * GB)}
    _gated(segue, "c", "normal", gates["c"])
    queued = wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "c"], 120, "c queued")
    assert queued[0]["reason"] == "waiting for 40 GiB on 1 gpu (best free: 16 GiB on gpu 0)"
    assert queued[0]["needs"].startswith("40 GiB on 1 gpu")
    assert "c" not in _live(segue)
    gates["a"].touch()  # a ends; its 40 GB let c in
    segue.wait_state("a", {"SUCCEEDED"}, 120)
    wait_for(lambda: _holding(segue, "c"), 120, "c to run once a let go")
    assert _live(segue) == {"b": ((0,), 40 * GB), "c": ((0,), 40 * GB)}
    gates["b"].touch()
    gates["c"].touch()
    for r in ("b", "c"):
        segue.wait_state(r, {"SUCCEEDED"}, 120)
    for r in ("a", "b", "c"):
        assert _exact(segue, r)["seen"] == ["0"]  # one attempt each, on gpu 0
    _never_over(segue)


def test_an_urgent_step_preempts_exactly_one_sharer_which_resumes(segue: Segue, tmp_path: Path
                                                                    ) -> None:
    gates = {r: tmp_path / f"gate-{r}" for r in ("a", "b", "hi")}
    _setup_96(segue)
    _gated(segue, "a", "batch", gates["a"])
    _gated(segue, "b", "batch", gates["b"])
    wait_for(lambda: _holding(segue, "a") and _holding(segue, "b"), 120, "a and b to run at once")
    _gated(segue, "hi", "urgent", gates["hi"])
    wait_for(lambda: _holding(segue, "hi"), 120, "the urgent step to get 40 GB")
    # Pausing one sharer frees 40 + 16 GB: enough. The other keeps running beside it.
    live = _live(segue)
    assert live["hi"] == ((0,), 40 * GB) and len(live) == 2, live
    [kept] = [r for r in ("a", "b") if r in live]
    victim = "b" if kept == "a" else "a"
    segue.wait_state(victim, {"PAUSED"}, 120)
    assert segue.status(kept)["state"] == "RUNNING"
    hi_events = [e["reason"] for e in segue.events("hi") if e["kind"] == "scheduler"]
    preempting = [r for r in hi_events if r.startswith("preempting ")]
    assert len(preempting) == 1 and preempting[0].startswith(f"preempting {victim} (batch"), hi_events
    # Paused, it waits for its 40 GB to come back, and says so (once its controller has
    # seen the urgent step placed; before, it waited behind the urgent step's request).
    why = "preempted; waiting for 40 GiB on 1 gpu (best free: 16 GiB on gpu 0)"
    wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == victim and q["reason"].startswith(why)],
             120, "the victim to wait for its memory")
    gates["hi"].touch()  # the urgent step ends: the victim resumes by itself
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    wait_for(lambda: _holding(segue, victim), 120, "the victim to resume by itself")
    gates[victim].touch()
    gates[kept].touch()
    for r in ("a", "b"):
        segue.wait_state(r, {"SUCCEEDED"}, 120)
    assert _exact(segue, "hi")["seen"] == ["0"]
    assert _exact(segue, kept)["seen"] == ["0"]
    assert _exact(segue, victim)["seen"] == ["0", "0"]  # preempted once, resumed from its checkpoint
    assert any("resuming after preemption" in e["reason"] for e in segue.events(victim))
    assert segue.status(kept)["accounting"]["preemptions"] == 0
    _never_over(segue)


ACCEL_FLOW = '''
import os
from segue import Flow

flow = Flow("typed")


@flow.step(gpus=1, gpu_memory="40GiB", accelerator="rtx-pro-6000")
def big(ctx):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


@flow.step(gpus=1, accelerator="l4")
def small(ctx):
    return os.environ.get("CUDA_VISIBLE_DEVICES")
'''


def test_accelerator_hints_pick_the_pool_type_or_are_refused(segue: Segue, tmp_path: Path) -> None:
    proc = segue("pool", "set", "--gpus", "2", "--gpu-mem", "24GiB", "--gpu-type", "l4",
                 "--group", "1x96GiB:rtx-pro-6000", "--cpus", "8")
    assert proc.returncode == 0, proc.stderr
    doc = segue.json("pool")
    assert [(d["name"], d["memory"] // GB) for d in doc["devices"]] == [
        ("l4", 24), ("l4", 24), ("rtx-pro-6000-blackwell", 96)]
    flow = tmp_path / "typed.py"
    flow.write_text(ACCEL_FLOW)
    segue("run", str(flow), "--run-id", "t", check=True)
    assert segue.output("t", "big") == "2"  # the rtx-pro-6000, though the l4s came first
    assert segue.output("t", "small") == "0"
    flow.write_text(ACCEL_FLOW.replace('accelerator="l4"', 'accelerator="h100"'))
    proc = segue("run", str(flow), "--run-id", "h")
    assert proc.returncode == 2
    assert proc.stderr.startswith(
        "segue: step 'small' needs 1 h100 gpu but host ") and \
        "has 2 l4, 1 rtx-pro-6000-blackwell; it can never run here" in proc.stderr
    assert segue("pool", "set").returncode == 2  # neither --gpus nor --group


@given(st.lists(st.tuples(st.integers(0, 300), st.floats(0, 100), st.integers(0, 1),
                          st.sampled_from([8, 24, 40, 60])), max_size=6),
       st.sampled_from([None, 16, 40, 70, 96]), st.integers(1, 2))
def test_memory_victims_always_make_room_and_are_minimal(specs, need_gb, gpus) -> None:
    # Sharers packed onto two 96 GB devices in order (a spec that does not fit is skipped).
    used, users, holders = [0, 0], [0, 0], []
    for n, (prio, lost, i, gb) in enumerate(specs):
        if used[i] + gb <= 96:
            used[i] += gb
            users[i] += 1
            holders.append(_h(f"r{n}", prio, [(i, gb)], lost=lost))
    free = cap(*(dev(i, 96, 96 - used[i], users[i]) for i in (0, 1)))
    need = Need(gpus=gpus) if need_gb is None else mem(need_gb, gpus=gpus)
    got = choose_victims(need, free, holders, 250)
    if got is None:
        return
    assert all(v.priority < 250 and v.preemptible for v in got)

    def freed(vs: list[Holder]) -> Capacity:
        c = free
        for v in vs:
            c = c.plus(v.devices, v.cpus, v.memory, v.shares)
        return c

    assert place(need, freed(got)) is not None
    for v in got:  # minimal: every victim is needed
        assert place(need, freed([x for x in got if x is not v])) is None
