"""Controller failover across hosts: `segue agent` on three hosts sharing one PostgreSQL
and one S3 API server (moto, loopback).

Each "host" is a home directory, a device pool and a host id of its own
(``--host-id``, exported to everything its agent starts); all three share the
metadata store (a throwaway database) and the run's checkpoints (an S3 bucket).
A counter run is submitted on host a. Then, again and again, whichever host
drives the run dies: its agent and its controller are SIGKILLed (the workers
die with their controller), or frozen with SIGSTOP past the lease and thawed
once another host has taken over. One of the surviving agents must take the
run over (exactly one takeover per death: the others back off), and the run
ends bit-identical to an uninterrupted one. Every fault is counted: the
deaths that landed, the takeovers, and the zombies' commits that were refused.

Kills are gated on observed progress (a checkpoint committed by the attempt
of the host about to die), never on time; the random pause before each kill
only varies where in its work the host dies.
"""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cluster_kit import QUICK, Cluster
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
from segue.states import RunState
from segue.store import Store

COUNTER = str(FLOWS / "counter.py")
def _assert_counter_output(segue: Segue, run: str, ref: dict[str, Any], n: int) -> None:
    got = segue.output(run, "count")
    assert got["acc"] == ref["count"]["acc"] and got["i"] == n
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    assert segue.output(run, "report") == ref["report"]


def _driving(store: Store, run: str) -> tuple[str, int, int, int]:
    """(host, controller pid, controller epoch, the count step's worker pid) once a live
    controller drives the run and its attempt has committed a checkpoint."""
    def ready() -> tuple[str, int, int, int] | None:
        r = store.get_run(run)
        t = store.get_task(run, "count")
        if r.state != RunState.RUNNING or not r.controller_alive(store.now()) or not t.pid:
            return None
        if t.host != r.controller_host or not pid_alive(r.controller_pid) or not pid_alive(t.pid):
            return None  # the previous host's attempt, or one not started yet
        mine = [c for c in store.list_checkpoints(run, "count") if c.path.rstrip("/").endswith(f"-e{t.epoch}")]
        return (r.controller_host, r.controller_pid, r.controller_epoch, t.pid) if mine else None
    return wait_for(ready, 120, f"a live controller of run {run} with a checkpoint of its own", poll=0.05)


@pytest.mark.timeout(900)
def test_hosts_die_again_and_again_and_the_run_ends_exactly_once(
        cluster: Cluster, counter_ref: Any, tmp_path: Path) -> None:
    run, n, deaths = "failover", 150, 20
    for host in "abc":
        cluster.start_agent(host)
    hold = tmp_path / "hold"  # the last iteration waits for it: every death lands mid-run
    a = cluster.home("a")
    proc = a("run", COUNTER, "--run-id", run, "--detach", "-p", f"n={n}", "-p", "sleep=0.004",
             "-p", f"hold={hold}")
    assert proc.returncode == 0, proc.stderr
    rng = random.Random(20261201)
    frozen = 0
    seen: list[str] = []
    for i in range(deaths):
        host, ctl, epoch, worker = _driving(cluster.store, run)
        seen.append(host)
        time.sleep(rng.uniform(0, 0.3))  # where in its work the host dies; not the outcome
        victims = [cluster.agents[host].pid, ctl, worker]
        freeze = i % 4 == 3  # every fourth death is a freeze, thawed after the takeover
        for pid in victims:
            os.kill(pid, signal.SIGSTOP if freeze else signal.SIGKILL)
        if not freeze:
            cluster.agents[host].wait()
        # Another host takes over: a new controller epoch on a host that is not the dead one.
        wait_for(lambda: (r := cluster.store.get_run(run)).controller_epoch > epoch
                 and r.controller_host != host and r.controller_alive(cluster.store.now()), 120,
                 f"a takeover after death {i + 1} of host {host}")
        if freeze:  # the zombie wakes up once another host's attempt holds the step
            wait_for(lambda: cluster.store.get_task(run, "count").host not in (None, host), 120,
                     "the new host's attempt")
            # Children first: a stopped process cannot exit, so each one is still there
            # when its SIGCONT is sent. (Thawed first, the controller would find itself
            # fenced and SIGKILL and reap its still-frozen worker before the worker's turn.)
            for pid in reversed(victims):
                os.kill(pid, signal.SIGCONT)
            frozen += 1
            # It finds itself fenced and stops by itself: the controller at its next
            # renewal, the worker at its next heartbeat or commit.
            wait_for(lambda: not pid_alive(ctl) and not pid_alive(worker), 120, "the zombies to stop")
        else:
            cluster.start_agent(host)  # the host comes back
    hold.touch()
    wait_for(lambda: cluster.store.get_run(run).state in (RunState.SUCCEEDED, RunState.FAILED), 300,
             "the run to end")
    assert cluster.store.get_run(run).state == RunState.SUCCEEDED
    _assert_counter_output(a, run, counter_ref(n), n)
    events = cluster.store.list_events(run)
    takeovers = [e for e in events if e.kind == "agent"]
    # Exactly one takeover per death, each by a host other than the one that died.
    assert len(takeovers) == deaths, [e.reason for e in takeovers]
    assert [e.data["from_host"] for e in takeovers] == seen
    assert all(e.data["host"] != e.data["from_host"] for e in takeovers)
    assert len(set(seen)) >= 2  # the run really moved between hosts
    # Every thawed zombie tried to commit and was refused.
    fenced = [e for e in events if e.kind == "fenced"]
    assert frozen == deaths // 4 and len(fenced) >= frozen, [e.reason for e in fenced]
    assert {h.host for h in cluster.store.list_hosts()} == {"a", "b", "c"}


def _kill_host(cluster: Cluster, host: str) -> None:
    r = cluster.store.get_run("skew")
    assert r.controller_host == host
    for pid in (cluster.agents[host].pid, r.controller_pid):
        os.kill(pid, signal.SIGKILL)
    cluster.agents[host].wait()
    wait_for(lambda: not pid_alive(r.controller_pid), 30, "the killed controller to be dead")  # landed


@pytest.mark.timeout(600)
def test_a_skewed_clock_can_neither_steal_a_live_lease_nor_keep_a_dead_one(
        cluster: Cluster, counter_ref: Any, tmp_path: Path) -> None:
    """Host b's clock runs 5 minutes fast, host c's 5 minutes slow ($SEGUE_CLOCK_SKEW_S moves
    every lease judgement of their processes that reads the host's clock). Leases are
    stamped and judged on the database's clock, so b never takes a live run, c takes a
    dead one over within a lease, and a controller on either drives it to the end."""
    run, n = "skew", 150
    hold = tmp_path / "hold"
    fast, slow = {"SEGUE_CLOCK_SKEW_S": "300"}, {"SEGUE_CLOCK_SKEW_S": "-300"}
    cluster.start_agent("a")
    cluster.start_agent("b", fast)
    a = cluster.home("a")
    proc = a("run", COUNTER, "--run-id", run, "--detach", "-p", f"n={n}", "-p", "sleep=0.004",
             "-p", f"hold={hold}")
    assert proc.returncode == 0, proc.stderr
    host, ctl, epoch, _ = _driving(cluster.store, run)
    assert host == "a"
    # 1. The fast host, seeing a's lease five minutes stale, must still leave the run alone:
    #    watch it renew its own lease 20 times (each a tick that judged the run).
    seen: list[float] = []
    wait_for(lambda: seen.append(next(h.seen_at for h in cluster.store.list_hosts() if h.host == "b"))
             or len(set(seen)) > 20, 120, "20 ticks of the fast host's agent", poll=0.1)
    r = cluster.store.get_run(run)
    assert (r.controller_host, r.controller_pid, r.controller_epoch) == ("a", ctl, epoch)
    assert not [e for e in cluster.store.list_events(run) if e.kind == "agent"]
    # 2. a dies; only the slow host is left: it takes over within a lease, not five minutes on.
    cluster.agents["b"].terminate()
    cluster.agents["b"].wait()
    cluster.start_agent("c", slow)
    _kill_host(cluster, "a")
    host, ctl, _, _ = _driving(cluster.store, run)  # its controller's own attempt checkpoints
    assert host == "c"
    # 3. c dies; the fast host takes over and its controller, judging its workers' leases,
    #    does not find them five minutes stale (it would kill every attempt it starts).
    cluster.start_agent("b", fast)
    _kill_host(cluster, "c")
    host, _, _, _ = _driving(cluster.store, run)
    assert host == "b"
    hold.touch()
    wait_for(lambda: cluster.store.get_run(run).state in (RunState.SUCCEEDED, RunState.FAILED), 300,
             "the run to end")
    assert cluster.store.get_run(run).state == RunState.SUCCEEDED
    t = cluster.store.get_task(run, "count")
    # One attempt per host: neither skewed controller killed an attempt of its own as stale.
    assert (t.attempts, t.failures) == (3, 0)
    _assert_counter_output(a, run, counter_ref(n), n)
    assert [e.data["host"] for e in cluster.store.list_events(run) if e.kind == "agent"] == ["c", "b"]


# -- one machine, SQLite: the agent's command line, and a local takeover --------------------------
def test_agent_command_line_and_a_local_takeover_on_sqlite(segue: Segue, counter_ref: Any,
                                                           tmp_path: Path) -> None:
    """On the embedded store too: bad options are one line; a second agent of the same
    host is refused; `segue hosts` lists the agent; a controller of this host that was
    SIGKILLed is dead at once, so its run is taken over without waiting out the lease."""
    bad = segue("agent", "--ttl", "0.1")
    assert bad.returncode == 2 and bad.stderr == (
        "segue: --ttl must be between 0.5 and 3600 seconds, not 0.1\n"), bad.stderr
    bad = segue("agent", "--ttl", "4", "--poll", "3")
    assert bad.returncode == 2 and "--poll must be above 0 and at most half of --ttl (2s)" in bad.stderr
    env = {"SEGUE_HOST_ID": "solo", **QUICK, "SEGUE_LEASE_TTL_S": "60"}  # a long lease: no waiting it out
    agent = segue.popen("agent", "--poll", "0.2", env=env)
    try:
        hosts = wait_for(lambda: [h for h in segue.json("hosts") if h["alive"]], 60, "the agent to register")
        assert [(h["host"], h["pid"]) for h in hosts] == [("solo", agent.pid)]
        second = segue("agent", env=env)
        assert second.returncode == 2 and second.stderr.startswith(
            f"segue: host 'solo' already has a live agent (pid {agent.pid}, lease until "), second.stderr
        assert second.stderr.count("\n") == 1
        hold = tmp_path / "hold"
        proc = segue("run", COUNTER, "--run-id", "local", "--detach", "-p", "n=150", "-p", "sleep=0",
                     "-p", f"hold={hold}", env=env)
        assert proc.returncode == 0, proc.stderr
        from segue.home import Home

        store = Home.resolve(segue.home).open_store()
        host, ctl, epoch, worker = _driving(store, "local")
        assert host == "solo"
        t0 = time.monotonic()
        os.kill(ctl, signal.SIGKILL)
        wait_for(lambda: (r := store.get_run("local")).controller_epoch > epoch
                 and pid_alive(r.controller_pid), 60, "the agent's takeover")
        assert time.monotonic() - t0 < 60  # not the 60 s lease: the dead pid was proof enough
        hold.touch()
        segue.wait_state("local", {"SUCCEEDED"}, 300)
        _assert_counter_output(segue, "local", counter_ref(150), 150)
        [took] = [e for e in store.list_events("local") if e.kind == "agent"]
        assert took.data["from_pid"] == ctl and took.data["host"] == "solo"
    finally:
        agent.terminate()
        _, err = agent.communicate(timeout=30)  # closes its pipes too
        assert agent.returncode == 0, err
    assert [h["alive"] for h in segue.json("hosts")] == [False]  # a clean stop ends the lease
