"""Crash recovery, pause/resume and fencing with real processes and real signals.

Each test compares the final output with an uninterrupted run bit for bit:
the counter flow draws from three RNGs per iteration, so one lost, repeated or
wrongly restored iteration changes the result.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, VirtualClock, wait_for

from segue._procs import pid_alive

COUNTER = str(FLOWS / "counter.py")
QUICK_RETRY = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}


def assert_same(segue: Segue, run_id: str, refs: Any, n: int) -> None:
    ref = refs(n)
    got = segue.output(run_id, "count")
    assert got["i"] == ref["count"]["i"]
    assert got["acc"] == ref["count"]["acc"]  # exact, not approximate
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    assert segue.output(run_id, "report") == ref["report"]


def running_pid(segue: Segue, run_id: str, step: str = "count", not_pid: int | None = None) -> int:
    # A foreground run may not have created its home and run yet.
    # Generous bounds: on a loaded 2-core machine starting a worker takes many seconds.
    wait_for(lambda: segue("status", run_id).returncode == 0, 120, f"run {run_id} to exist")

    def pid() -> int | None:
        s = segue.step(run_id, step)
        return s["pid"] if s["state"] == "RUNNING" and s["pid"] and s["pid"] != not_pid else None

    return wait_for(pid, 180, f"{step} to run")


def done_count(segue: Segue, run_id: str) -> float:
    return segue.step(run_id, "count")["progress"]["done"] or 0


def freeze(segue: Segue, pid: int) -> None:
    """SIGSTOP ``pid`` at a moment it holds no store write lock.

    A process frozen inside a write transaction blocks every other writer of
    the SQLite store for as long as it stays frozen, controller included; a
    test that freezes a process to play a partition retries until it froze it
    between transactions.
    """
    db = segue.home / "segue.db"
    while True:
        os.kill(pid, signal.SIGSTOP)
        wait_for(lambda: _proc_state(pid) in ("T", "t"), 30, f"pid {pid} to stop")
        conn = sqlite3.connect(db, timeout=0)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # frozen holding the lock (or someone else writes): again
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
        finally:
            conn.close()


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


class Gate:
    """The counter flow's ``hold`` file: its last iteration waits until the test opens
    the gate, so every fault a test plans lands before the run can finish."""

    def __init__(self, path: Any) -> None:
        self.path = path

    @property
    def args(self) -> tuple[str, str]:
        return ("-p", f"hold={self.path}")

    def open(self) -> None:
        self.path.write_text("go")


@pytest.fixture
def gate(tmp_path: Any) -> Gate:
    return Gate(tmp_path / "gate")


def checkpointed(segue: Segue, run_id: str, epoch: int, at_least: int = 1) -> bool:
    """Has the attempt with ``epoch`` committed ``at_least`` checkpoints (observed progress)?"""
    return sum(c.epoch == epoch for c in store_of(segue).list_checkpoints(run_id, "count")) >= at_least


def current_epoch(segue: Segue, run_id: str) -> int:
    return store_of(segue).get_task(run_id, "count").epoch


def sigkill_events(segue: Segue, run_id: str) -> int:
    # Transitions only: a failure also leaves a "failure" event with the same words.
    return sum("killed by SIGKILL" in e["reason"] for e in segue.events(run_id)
               if e["actor"] == "failure-detector" and e["kind"] == "task")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_seeded_worker_sigkills(segue: Segue, counter_ref, gate: Gate, seed: int) -> None:
    """Five SIGKILLs of the worker per seed (20 in all), each after a seeded number
    of checkpoints of the attempt it kills; the gate keeps the run from finishing first."""
    rnd = random.Random(seed)
    run = f"kill{seed}"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=2000", "-p", "sleep=0.002",
          *gate.args, env=QUICK_RETRY, check=True)
    landed = 0
    last = None
    while landed < 5:
        pid = running_pid(segue, run, not_pid=last)
        epoch, k = current_epoch(segue, run), rnd.randint(1, 3)
        wait_for(lambda: checkpointed(segue, run, epoch, k), 60, f"{k} checkpoints")
        os.kill(pid, signal.SIGKILL)  # the gate holds the worker alive: this cannot miss
        landed += 1
        last = pid
        # The failure detector saw this very kill before the next one is aimed.
        wait_for(lambda: sigkill_events(segue, run) >= landed, 60, f"kill {landed} to be recorded")
    gate.open()
    segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 120)
    doc = segue.status(run)
    assert doc["state"] == "SUCCEEDED", doc
    count = doc["steps"][0]
    assert count["attempts"] == 6
    assert_same(segue, run, counter_ref, 2000)
    assert sigkill_events(segue, run) == landed == 5


def test_pause_resume_cycles(segue: Segue, counter_ref, gate: Gate) -> None:
    run = "cycles"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004",
          *gate.args, check=True)
    for cycle in range(3):
        pid = running_pid(segue, run)
        epoch = current_epoch(segue, run)
        wait_for(lambda: checkpointed(segue, run, epoch), 60, f"progress in cycle {cycle}")
        proc = segue("pause", run, "--wait", "--timeout", "60")
        assert proc.returncode == 0, proc.stderr
        doc = segue.status(run)
        assert doc["state"] == "PAUSED"
        assert doc["steps"][0]["state"] == "PARKED"  # the gate: it cannot have finished
        assert doc["steps"][0]["pid"] is None
        assert not pid_alive(pid)  # the worker process is gone, not just idle
        assert segue("resume", run, "--detach").returncode == 0
    gate.open()
    segue.wait_state(run, {"SUCCEEDED"}, 120)
    assert_same(segue, run, counter_ref, 400)
    parks = [e for e in segue.events(run) if e["to_state"] == "PARKED"]
    assert len(parks) == 3
    # Pauses are not failures: no retries were spent.
    assert segue.step(run, "count")["failures"] == 0


def test_controller_sigkill_then_resume(segue: Segue, counter_ref, gate: Gate) -> None:
    run = "ctlkill"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004",
          *gate.args, check=True)
    worker = running_pid(segue, run)
    wait_for(lambda: done_count(segue, run) > 60, 30, "progress")
    ctl = segue.status(run)["controller"]["pid"]
    os.kill(ctl, signal.SIGKILL)
    # The worker dies with its controller (no orphan keeps computing).
    wait_for(lambda: not pid_alive(worker), 10, "worker death")
    assert segue.status(run)["state"] == "RUNNING"  # nobody is left to say otherwise
    gate.open()
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert_same(segue, run, counter_ref, 400)
    reasons = [e["reason"] for e in segue.events(run)]
    assert any("attempt lost with its controller" in r for r in reasons)
    assert segue.step(run, "count")["failures"] == 0


def test_second_controller_is_refused(segue: Segue, gate: Gate) -> None:
    run = "two"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.01",
          *gate.args, check=True)
    running_pid(segue, run)
    proc = segue("resume", run)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"segue: run '{run}' is already driven by a live controller")
    segue("cancel", run, check=True)
    segue.wait_state(run, {"CANCELLED"})


def test_zombie_attempt_is_fenced(segue: Segue, counter_ref, gate: Gate) -> None:
    """Freeze controller and worker (a partitioned node), take over, then thaw them.

    The thawed zombies must really try to write and be refused: the store
    records every refused write as a ``fenced`` event, and the test counts the
    ones made with the zombies' epochs.
    """
    run = "zombie"
    clock = VirtualClock(segue.home.parent / "clock")
    segue.env.update(clock.env)
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004",
          *gate.args, check=True)
    worker = running_pid(segue, run)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    ctl = segue.status(run)["controller"]["pid"]
    freeze(segue, ctl)
    freeze(segue, worker)
    new = None
    try:
        zombie_epoch = segue.step(run, "count")["epoch"]
        zombie_ctl_epoch = store_of(segue).get_run(run).controller_epoch
        clock.advance(3600)  # both leases expire, in virtual time: no sleeping against them
        new = segue.popen("resume", run)
        new_worker = running_pid(segue, run, not_pid=worker)
        wait_for(lambda: done_count(segue, run) > 0, 30, "the new attempt to progress")
        assert segue.step(run, "count")["epoch"] > zombie_epoch
        # Thaw the worker alone first: its controller is still frozen, so nothing
        # kills it before it tries its next write (a heartbeat or a checkpoint commit).
        os.kill(worker, signal.SIGCONT)
        wait_for(lambda: refused(segue, run, "worker", zombie_epoch), 30, "the zombie's refused write")
        wait_for(lambda: not pid_alive(worker), 15, "the zombie worker to exit")
    finally:
        os.kill(worker, signal.SIGCONT)
        os.kill(ctl, signal.SIGCONT)
    wait_for(lambda: refused(segue, run, "controller", zombie_ctl_epoch), 30,
             "the zombie controller's refused lease renewal")
    wait_for(lambda: not pid_alive(ctl), 15, "the zombie controller to exit")
    gate.open()
    assert new is not None
    out, err = new.communicate(timeout=120)
    assert new.returncode == 0, err
    assert new_worker != worker
    assert_same(segue, run, counter_ref, 400)
    # The zombies tried and were refused; their writes changed nothing.
    assert len(refused(segue, run, "worker", zombie_epoch)) >= 1
    assert len(refused(segue, run, "controller", zombie_ctl_epoch)) >= 1
    cks = store_of(segue).list_checkpoints(run, "count")
    seqs = [c.seq for c in cks]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)
    # Every checkpoint committed after the takeover came from the new epoch.
    takeover = min(c.seq for c in cks if c.epoch > zombie_epoch)
    assert all(c.epoch > zombie_epoch for c in cks if c.seq >= takeover)


def store_of(segue: Segue) -> Any:
    from segue.home import Home

    return Home.resolve(segue.home).open_store()


def refused(segue: Segue, run: str, actor: str, epoch: int) -> list[Any]:
    """The store's record of writes refused to ``actor`` at ``epoch`` (a zombie)."""
    return [e for e in segue.events(run)
            if e["kind"] == "fenced" and e["actor"] == actor and e["data"]["epoch"] == epoch]


def test_hung_worker_is_killed_after_lease(segue: Segue, counter_ref, gate: Gate) -> None:
    """A frozen worker stops heartbeating; once its lease has passed (in virtual
    time, no sleeping) the controller kills it and a retry finishes exactly."""
    run = "hung"
    clock = VirtualClock(segue.home.parent / "clock")
    segue.env.update(clock.env)
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          *gate.args, check=True)
    worker = running_pid(segue, run)
    epoch = current_epoch(segue, run)
    wait_for(lambda: checkpointed(segue, run, epoch), 60, "the attempt to checkpoint")
    freeze(segue, worker)
    try:
        assert not any("lease expired" in e["reason"] for e in segue.events(run))
        clock.advance(60)  # well past the 10 s lease of the frozen attempt
        wait_for(lambda: any("lease expired" in e["reason"] for e in segue.events(run)), 60,
                 "the controller to notice the expired lease")
        wait_for(lambda: not pid_alive(worker), 30, "the hung worker to be killed")
    finally:
        if pid_alive(worker):
            os.kill(worker, signal.SIGKILL)
    gate.open()
    segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 90)
    assert_same(segue, run, counter_ref, 300)
    # The frozen attempt was the one killed for its lease (a retry starting slowly on a
    # loaded machine may lose its own lease too, so later attempts are not counted).
    first = next(e for e in segue.events(run) if e["kind"] == "task" and e["to_state"] == "RETRYING")
    assert first["reason"].startswith("attempt epoch 1 stopped heartbeating (lease expired)"), first
    # It had committed a checkpoint: its failure starts the count over, and the reason says so.
    assert first["reason"].endswith("(this attempt committed a checkpoint: the count of failures "
                                    "starts over)"), first


def test_pause_deadline_kills_and_resume_is_exact(segue: Segue, counter_ref, gate: Gate,
                                                  tmp_path: Any) -> None:
    run, ready = "stubborn", tmp_path / "ready"
    segue("run", COUNTER, "--run-id", run, "--detach", "--pause-deadline", "0.5",
          "-p", "n=400", "-p", "sleep=0.004", "-p", "ignore_pause=true",
          "-p", f"ready={ready}", *gate.args, check=True)
    # Once `ready` exists the step has its checkpoint and never reaches a pause point again.
    wait_for(ready.exists, 120, "the stubborn step's checkpoint")
    proc = segue("pause", run, "--wait", "--timeout", "60")
    assert proc.returncode == 0, proc.stderr
    events = segue.events(run)
    assert any("killed at the pause deadline" in e["reason"] for e in events), events
    gate.open()
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert_same(segue, run, counter_ref, 400)


def test_ctrl_c_pauses_then_second_stops_at_once(segue: Segue, counter_ref, gate: Gate) -> None:
    run = "ctrlc"
    p = segue.popen("run", COUNTER, "--run-id", run, "-p", "n=400", "-p", "sleep=0.004", *gate.args)
    running_pid(segue, run)
    epoch = current_epoch(segue, run)
    wait_for(lambda: checkpointed(segue, run, epoch), 60, "the attempt to checkpoint")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert segue.status(run)["state"] == "PAUSED"
    assert f"segue resume {run}" in out
    # Second: resume in the foreground, then Ctrl-C twice quickly.
    p = segue.popen("resume", run)
    running_pid(segue, run)
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert segue.status(run)["state"] == "PAUSED"
    gate.open()
    assert segue("resume", run).returncode == 0
    assert_same(segue, run, counter_ref, 400)


def test_retries_exhausted_fail_then_resume(segue: Segue, tmp_path, counter_ref) -> None:
    marker = tmp_path / "fail"
    marker.write_text("x")
    run = "fails"
    proc = segue("run", COUNTER, "--run-id", run, "-p", "n=400", "-p", "sleep=0",
                 "-p", f"fail_marker={marker}", env=QUICK_RETRY)
    assert proc.returncode == 1
    doc = segue.status(run)
    assert doc["state"] == "FAILED"
    assert doc["steps"][0]["error"] == "RuntimeError: fail marker present"
    assert doc["steps"][0]["attempts"] == 21  # 1 + 20 retries
    marker.unlink()
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert_same(segue, run, counter_ref, 400)


def test_pause_on_failure(segue: Segue, tmp_path) -> None:
    marker = tmp_path / "fail"
    marker.write_text("x")
    proc = segue("run", COUNTER, "--run-id", "pof", "--pause-on-failure", "-p", "sleep=0",
                 "-p", f"fail_marker={marker}", env=QUICK_RETRY)
    assert proc.returncode == 3
    assert segue.status("pof")["state"] == "PAUSED"


def test_resume_refuses_changed_code(segue: Segue, tmp_path, counter_ref) -> None:
    flow = tmp_path / "counter.py"
    flow.write_text((FLOWS / "counter.py").read_text())
    run = "code"
    gate = Gate(tmp_path / "gate")
    segue("run", str(flow), "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          *gate.args, check=True)
    running_pid(segue, run)
    assert segue("pause", run, "--wait", "--timeout", "60").returncode == 0
    flow.write_text(flow.read_text().replace("return {\"acc2\"", "return {\"acc3\": 0, \"acc2\""))
    proc = segue("resume", run)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"segue: the code of run '{run}' changed since it began (steps 'report' changed); "
        "restore the original file or pass --allow-code-change"
    )
    assert segue.status(run)["state"] == "PAUSED"  # nothing written
    gate.open()
    proc = segue("resume", run, "--allow-code-change")
    assert proc.returncode == 0, proc.stderr
    assert segue.output(run, "count")["acc"] == counter_ref(300)["count"]["acc"]
