"""The cluster-wide device pool on PostgreSQL: controllers of several hosts race for
its devices, with leases that lapse, and no device is ever held twice; an urgent run
submitted on one host preempts a batch run on another and moves there."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_kit import Cluster
from segue_helpers import FLOWS, Segue, flow_module, wait_for

from segue.store.postgres import PostgresStore
from segue.store.postgres_hostpool import PostgresHostPool

HOSTS = {"h0": 2, "h1": 1, "h2": 1}  # four devices on three hosts
GB = 2**30

# One controller's calls to the pool, as RunScheduler makes them: allocate on its host
# (or, when that host is full, on any host: a cluster-wide pool), bind the attempt's
# epoch, renew while the attempt runs, release. Now and then it stalls past its lease
# (a frozen process): its devices go to someone else and its renewal must be refused.
RACER = """
import json, random, sys, time
from segue.placement.policy import Need
from segue.store.postgres_hostpool import PostgresHostPool
from segue.store.pool import Allocated
url, me, home_host, until, seed = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
rnd = random.Random(seed)
pool = PostgresHostPool(url)
hosts = ["h0", "h1", "h2"]
TTL = 0.6
got = refused = stalls = denied = 0
epoch = 0
while time.time() < until:
    step = f"s{epoch}"
    placed = None
    for host in [home_host] + [h for h in hosts if h != home_host]:
        res = pool.allocate("cluster", me, step, host=host, need=Need(gpus=1, cpus=0.1),
                            priority=rnd.choice((50, 100, 200)), preemptible=True, ttl_s=TTL)
        if isinstance(res, Allocated):
            placed = res
            break
        denied += 1
    if placed is None:
        time.sleep(rnd.uniform(0.05, 0.15))  # a controller's tick; no busy loop (2 cores)
        continue
    epoch += 1
    if not pool.bind(placed.id, epoch, TTL):
        refused += 1
        continue
    got += 1
    if rnd.random() < 0.1:  # frozen past its lease
        stalls += 1
        time.sleep(TTL * 1.5)
        if not pool.renew("cluster", me, step, epoch, ttl_s=TTL, ckpt_at=None, preemptions=0):
            refused += 1
            continue  # it lost the devices: it must not use them, and gives nothing back
    for _ in range(rnd.randint(0, 3)):
        time.sleep(rnd.uniform(0.02, 0.15))
        assert pool.renew("cluster", me, step, epoch, ttl_s=TTL, ckpt_at=None, preemptions=0)
    pool.release("cluster", me, step, epoch)
print(json.dumps({"got": got, "refused": refused, "stalls": stalls, "denied": denied}))
"""


def test_eight_controllers_on_three_hosts_race_for_four_devices_for_a_minute(
        new_target: Callable[[str], str], tmp_path: Path) -> None:
    url = new_target("postgres")
    pool = PostgresHostPool(PostgresStore(url))
    for host, n in HOSTS.items():
        pool.configure_host(host, cpus=8, memory=64 * GB, source="configured",
                            devices=[(f"v{i}", 80 * GB, True) for i in range(n)])
    script = tmp_path / "racer.py"
    script.write_text(RACER)
    until = time.time() + 60.0
    procs = [subprocess.Popen([sys.executable, str(script), url, f"c{i}", f"h{i % 3}", str(until),
                               str(i)], stdout=subprocess.PIPE, text=True) for i in range(8)]
    try:
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), outs
    stats = [json.loads(o) for o in outs]
    got = sum(s["got"] for s in stats)
    print({k: sum(s[k] for s in stats) for k in stats[0]})  # the figures, with -s
    history = pool.list_allocations(live_only=False)
    # The race happened: every controller held devices, many were denied a busy host
    # or had to go to another one, and frozen holders lost their lease to others.
    assert all(s["got"] > 0 for s in stats), stats
    assert sum(s["denied"] for s in stats) > 100, stats
    assert sum(s["stalls"] for s in stats) > 0 and sum(s["refused"] for s in stats) > 0, stats
    assert {a.host for a in history} == set(HOSTS)
    assert {a.run_id for a in history if a.host != f"h{int(a.run_id[1:]) % 3}"}, \
        "no controller ever took a device of another host"
    # No device was ever held by two allocations at once: each holder's span runs from
    # its allocation to its release, or to its lease's end when it lapsed unreleased.
    bound = [a for a in history if a.epoch is not None and a.epoch > 0]
    assert len(bound) == got  # every successful bind is one row
    for host, n in HOSTS.items():
        for dev in range(n):
            spans = sorted((a.since, a.released_at if a.released_at is not None
                            and a.released_at < a.lease_until else a.lease_until)
                           for a in history if a.host == host and dev in a.devices)
            for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
                assert e1 <= s2, f"{host} device {dev} held twice: {s1}-{e1} and {s2}"
    pool.close()


GPUJOB = str(FLOWS / "gpujob.py")
_gpujob = flow_module("gpujob")


def _work(segue: Segue, run: str) -> dict[str, Any]:
    return segue.step(run, "work")


@pytest.mark.timeout(600)
def test_an_urgent_run_submitted_on_one_host_preempts_a_batch_run_on_another(
        cluster: Cluster, tmp_path: Path) -> None:
    """Host a has no GPU, host b has one, held by a batch run. An urgent run submitted on
    a pauses the batch run on b and moves there; the batch run resumes by itself after."""
    cluster.cluster_pool = True  # no SEGUE_POOL: the store's database holds the pool
    # Nothing here waits out a lease (no process is killed): long ones, so that a CPU starved
    # by other tests never lapses a controller's or an agent's lease (CI: a lapsed one had an
    # agent take the batch run over while it was being preempted).
    cluster.env["SEGUE_LEASE_TTL_S"] = "30"
    a, b = cluster.home("a"), cluster.home("b")
    for host, n in ((a, 0), (b, 1)):
        host("pool", "set", "--gpus", str(n), "--gpu-mem", "80GB", "--cpus", "8", check=True)
    cluster.start_agent("a", ttl="20")
    cluster.start_agent("b", ttl="20")
    gate = {r: tmp_path / f"gate-{r}" for r in ("low", "hi")}  # each holds its run half-way
    b("run", GPUJOB, "--detach", "--run-id", "low", "--priority", "batch", "-p", "n=400",
      "-p", f"gate={gate['low']}", check=True)
    wait_for(lambda: _work(b, "low")["state"] == "RUNNING"
             and (_work(b, "low")["progress"]["done"] or 0) >= 20, 120, "the batch run to run on b")
    a("run", GPUJOB, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=40",
      "-p", f"gate={gate['hi']}", check=True)
    # The urgent run holds b's device, started by b's agent; the batch run waits, paused.
    wait_for(lambda: _work(a, "hi")["state"] == "RUNNING" and _work(a, "hi")["pid"], 180,
             "the urgent run to start on host b")
    assert cluster.store.get_task("hi", "work").host == "b"
    a.wait_state("low", {"PAUSED"}, 60)
    hi = [e for e in a.events("hi")]
    said = " | ".join(e["reason"] for e in hi)
    assert any(e["kind"] == "scheduler" and "preempting low" in e["reason"] and "on host b" in e["reason"]
               for e in hi), said
    moved = [e for e in hi if e["kind"] == "scheduler" and e["reason"].startswith("moving the run to host b")]
    assert len(moved) == 1 and moved[0]["data"]["from_host"] == "a", said
    took = [e for e in hi if e["kind"] == "agent"]
    assert [(e["data"]["host"], e["data"]["moved"]) for e in took] == [("b", True)], said
    assert "preempted by run 'hi'" in " | ".join(e["reason"] for e in b.events("low"))
    gate["hi"].touch()
    a.wait_state("hi", {"SUCCEEDED"}, 180)
    gate["low"].touch()
    b.wait_state("low", {"SUCCEEDED"}, 180)  # resumed by itself on b: nobody asked it to
    for run, n in (("hi", 40), ("low", 400)):
        out = a.output(run, "work")
        assert out["i"] == n and out["acc"] == _gpujob.expected_acc(n)  # nothing lost or repeated
    # Both ran on b's one device, never at once: hi's allocation lies between low's two.
    pool = PostgresHostPool(cluster.store)
    history = sorted((x for x in pool.list_allocations("b", live_only=False) if x.epoch and x.epoch > 0),
                     key=lambda x: x.since)
    assert [x.run_id for x in history] == ["low", "hi", "low"], history
    for x, y in zip(history, history[1:], strict=False):
        assert x.released_at is not None and x.released_at <= y.since


@pytest.mark.timeout(900)
def test_eight_runs_on_three_hosts_share_four_devices_by_priority(
        cluster: Cluster, tmp_path: Path) -> None:
    """Real controllers: eight runs of four priorities submitted on three hosts (a: two
    GPUs, b and c: one each). Each holds half-way until the test opens its gate, so every
    contention below is set up by observed state, not by timing."""
    cluster.cluster_pool = True
    # Nothing here waits out a lease (no process is killed): long ones, so that a CPU
    # starved by other tests never lapses a controller's or an agent's lease.
    cluster.env["SEGUE_LEASE_TTL_S"] = "30"
    homes = {h: cluster.home(h) for h in "abc"}
    for host, n in (("a", 2), ("b", 1), ("c", 1)):
        homes[host]("pool", "set", "--gpus", str(n), "--gpu-mem", "80GB", "--cpus", "8", check=True)
        cluster.start_agent(host, ttl="20")
    store = cluster.store
    gates: dict[str, Path] = {}

    def submit(run: str, host: str, priority: str) -> None:
        gates[run] = tmp_path / f"gate-{run}"
        homes[host]("run", GPUJOB, "--detach", "--run-id", run, "--priority", priority, "-p", "n=200",
                    "-p", f"gate={gates[run]}", check=True)

    def runs_on(run: str, host: str) -> bool:
        t = store.get_task(run, "work")
        return t.state.value == "RUNNING" and t.host == host and bool(t.pid) \
            and (t.progress_done or 0) >= 100  # at its gate: holding its device

    def waits(run: str) -> bool:
        return any(r.run_id == run for r in PostgresHostPool(store).list_requests())

    def preempted(victim: str, by: str) -> bool:
        """``by`` preempted ``victim``, which holds no device now (a preempted run may
        already be RUNNING again, waiting in line: it resumes by itself)."""
        return any(f"preempted by run '{by}'" in e.reason for e in store.list_events(victim)) \
            and not any(x.run_id == victim for x in PostgresHostPool(store).list_allocations())

    def wait(pred: Callable[[], bool], timeout: float, what: str, run: str) -> None:
        try:
            wait_for(pred, timeout, what)
        except AssertionError as e:  # say what the run and the pool were doing
            pool = PostgresHostPool(store)
            said = [(ev.kind, ev.actor, ev.to_state, ev.reason) for ev in store.list_events(run)]
            raise AssertionError(f"{e}; {run}'s events: {said}; its task: "
                                 f"{store.get_task(run, 'work')}; requests: {pool.list_requests()}; "
                                 f"allocations: {pool.list_allocations()}; every run: {everyone()}; agents: "
                                 f"{[(h.host, h.pid, h.alive(store.now())) for h in store.list_hosts()]}") from None

    def everyone() -> dict[str, tuple[str, str, str | None, int | None]]:
        tasks = {r: store.get_task(r, "work") for r in gates}
        return {r: (store.get_run(r).state.value, t.state.value, t.host, t.progress_done)
                for r, t in tasks.items()}

    # Four runs take the four devices.
    for run, host, prio in (("r0", "a", "batch"), ("r1", "b", "normal"), ("r2", "c", "high"),
                            ("r3", "a", "urgent")):
        submit(run, host, prio)
        wait(lambda run=run, host=host: runs_on(run, host), 180, f"{run} to hold a device of {host}", run)
    # `segue pool --all-hosts` shows the whole cluster, the asking host first.
    view = homes["b"].json("pool", "--all-hosts")
    assert [v["host"] for v in view] == ["b", "a", "c"]
    holders = {v["host"]: sorted(d["holder"]["run_id"] for d in v["devices"] if d["holder"])
               for v in view}
    assert holders == {"a": ["r0", "r3"], "b": ["r1"], "c": ["r2"]}, holders
    assert len({v["pool"] for v in view}) == 1 and view[0]["pool"].startswith("postgresql://")
    # A batch run can preempt nobody: it waits.
    submit("r4", "b", "batch")
    wait(lambda: waits("r4"), 120, "r4 to wait in line", "r4")
    # A normal run on c (held by a high run) preempts the batch run on a and moves there.
    submit("r5", "c", "normal")
    wait(lambda: runs_on("r5", "a"), 180, "r5 to move to host a", "r5")
    assert preempted("r0", "r5"), store.list_events("r0")
    # An urgent run on b preempts b's normal run (one victim here or on a: this host wins).
    submit("r6", "b", "urgent")
    wait(lambda: runs_on("r6", "b"), 180, "r6 to run on b", "r6")
    assert preempted("r1", "r6"), store.list_events("r1")
    # A high run on a preempts the normal run that moved there.
    submit("r7", "a", "high")
    wait(lambda: runs_on("r7", "a"), 180, "r7 to run on a", "r7")
    assert preempted("r5", "r7"), store.list_events("r5")
    for g in gates.values():
        g.touch()
    for run in gates:  # the paused ones resume by themselves
        wait(lambda run=run: store.get_run(run).state.value == "SUCCEEDED", 300, f"{run} to succeed", run)
        out = homes["a"].output(run, "work")
        assert out["i"] == 200 and out["acc"] == _gpujob.expected_acc(200), run
    events = {run: store.list_events(run) for run in gates}
    moves = {run: [e.data["host"] for e in ev if e.kind == "scheduler"
                   and e.reason.startswith("moving the run to host")] for run, ev in events.items()}
    assert moves["r5"][0] == "a" and not moves["r6"] and not moves["r7"], moves
    preempted = {run: sum(1 for e in ev if "preempted by run" in e.reason) for run, ev in events.items()}
    assert preempted["r0"] >= 1 and preempted["r1"] >= 1 and preempted["r5"] >= 1, preempted
    # Every device of the cluster, over the whole history: never two holders at once.
    history = [x for x in PostgresHostPool(store).list_allocations(live_only=False)
               if x.epoch is not None and x.epoch > 0]
    assert {x.run_id for x in history} == set(gates)
    for host, n in (("a", 2), ("b", 1), ("c", 1)):
        for dev in range(n):
            spans = sorted((x.since, x.released_at or x.lease_until) for x in history
                           if x.host == host and dev in x.devices)
            for (s1, e1), (s2, _) in zip(spans, spans[1:], strict=False):
                assert e1 <= s2, f"{host} device {dev} held twice: {s1}-{e1} and {s2}"
