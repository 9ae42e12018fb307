"""Crash recovery, pause/resume and fencing with real processes and real signals.

Each test compares the final output with an uninterrupted run bit for bit:
the counter flow draws from three RNGs per iteration, so one lost, repeated or
wrongly restored iteration changes the result.
"""

from __future__ import annotations

import os
import random
import signal
import time
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.run.procs import pid_alive

COUNTER = str(FLOWS / "counter.py")
FAST_LEASE = {"SEGUE_LEASE_TTL_S": "1.5"}
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
    wait_for(lambda: segue("status", run_id).returncode == 0, 30, f"run {run_id} to exist")

    def pid() -> int | None:
        s = segue.step(run_id, step)
        return s["pid"] if s["state"] == "RUNNING" and s["pid"] and s["pid"] != not_pid else None

    return wait_for(pid, 60, f"{step} to run")


def done_count(segue: Segue, run_id: str) -> float:
    return segue.step(run_id, "count")["progress"]["done"] or 0


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_seeded_worker_sigkills(segue: Segue, counter_ref, seed: int) -> None:
    """Five SIGKILLs of the worker at seeded random moments per seed (20 in all)."""
    rnd = random.Random(seed)
    run = f"kill{seed}"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=2000", "-p", "sleep=0.002",
          env=QUICK_RETRY, check=True)
    killed = 0
    last = None
    while killed < 5:
        pid = running_pid(segue, run, not_pid=last)
        time.sleep(rnd.uniform(0.0, 0.35))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed += 1
        last = pid
    segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 120)
    doc = segue.status(run)
    assert doc["state"] == "SUCCEEDED", doc
    count = doc["steps"][0]
    assert count["attempts"] >= 6
    assert_same(segue, run, counter_ref, 2000)
    kinds = [e["reason"] for e in segue.events(run) if e["actor"] == "failure-detector"]
    assert sum("killed by SIGKILL" in r for r in kinds) >= 5


def test_pause_resume_cycles(segue: Segue, counter_ref) -> None:
    run = "cycles"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004", check=True)
    for _ in range(3):
        pid = running_pid(segue, run)
        time.sleep(0.2)
        proc = segue("pause", run, "--wait", "--timeout", "30")
        assert proc.returncode == 0, proc.stderr
        doc = segue.status(run)
        assert doc["state"] == "PAUSED"
        assert doc["steps"][0]["state"] in ("PARKED", "SUCCEEDED")
        assert doc["steps"][0]["pid"] is None
        assert not pid_alive(pid)  # the worker process is gone, not just idle
        assert segue("resume", run, "--detach").returncode == 0
    segue.wait_state(run, {"SUCCEEDED"}, 120)
    assert_same(segue, run, counter_ref, 400)
    # Pauses are not failures: no retries were spent.
    assert segue.step(run, "count")["failures"] == 0


def test_controller_sigkill_then_resume(segue: Segue, counter_ref) -> None:
    run = "ctlkill"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004", check=True)
    worker = running_pid(segue, run)
    wait_for(lambda: done_count(segue, run) > 60, 30, "progress")
    ctl = segue.status(run)["controller"]["pid"]
    os.kill(ctl, signal.SIGKILL)
    # The worker dies with its controller (no orphan keeps computing).
    wait_for(lambda: not pid_alive(worker), 10, "worker death")
    assert segue.status(run)["state"] == "RUNNING"  # nobody is left to say otherwise
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert_same(segue, run, counter_ref, 400)
    reasons = [e["reason"] for e in segue.events(run)]
    assert any("attempt lost with its controller" in r for r in reasons)
    assert segue.step(run, "count")["failures"] == 0


def test_second_controller_is_refused(segue: Segue) -> None:
    run = "two"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.01", check=True)
    running_pid(segue, run)
    proc = segue("resume", run)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(f"segue: run '{run}' is already driven by a live controller")
    segue("cancel", run, check=True)
    segue.wait_state(run, {"CANCELLED"})


def test_zombie_attempt_is_fenced(segue: Segue, counter_ref) -> None:
    """Freeze controller and worker (a partitioned node), take over, then thaw them."""
    run = "zombie"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=400", "-p", "sleep=0.004",
          env=FAST_LEASE, check=True)
    worker = running_pid(segue, run)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    ctl = segue.status(run)["controller"]["pid"]
    os.kill(ctl, signal.SIGSTOP)
    os.kill(worker, signal.SIGSTOP)
    try:
        time.sleep(2.0)  # both leases (1.5 s) expire
        new = segue.popen("resume", run)
        new_worker = running_pid(segue, run, not_pid=worker)
        epoch_before = segue.step(run, "count")["epoch"]
        wait_for(lambda: done_count(segue, run) > 0, 30, "the new attempt to progress")
    finally:
        os.kill(worker, signal.SIGCONT)
        os.kill(ctl, signal.SIGCONT)
    # The zombies notice they were superseded and stop themselves.
    wait_for(lambda: not pid_alive(worker), 15, "the zombie worker to exit")
    out, err = new.communicate(timeout=120)
    assert new.returncode == 0, err
    assert new_worker != worker and epoch_before >= 2
    assert_same(segue, run, counter_ref, 400)
    # Every committed checkpoint after the takeover came from the new epoch.
    from segue.home import Home

    store = Home.resolve(segue.home).open_store()
    cks = store.list_checkpoints(run, "count")
    seqs = [c.seq for c in cks]
    assert seqs == sorted(seqs, reverse=True) and len(set(seqs)) == len(seqs)


def test_hung_worker_is_killed_after_lease(segue: Segue, counter_ref) -> None:
    run = "hung"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          env=FAST_LEASE, check=True)
    worker = running_pid(segue, run)
    time.sleep(0.3)
    os.kill(worker, signal.SIGSTOP)
    segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 90)
    assert_same(segue, run, counter_ref, 300)
    assert any("lease expired" in e["reason"] for e in segue.events(run))


def test_pause_deadline_kills_and_resume_is_exact(segue: Segue, counter_ref) -> None:
    run = "stubborn"
    segue("run", COUNTER, "--run-id", run, "--detach", "--pause-deadline", "0.5",
          "-p", "n=400", "-p", "sleep=0.004", "-p", "ignore_pause=true", check=True)
    running_pid(segue, run)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    proc = segue("pause", run, "--wait", "--timeout", "20")
    assert proc.returncode == 0, proc.stderr
    assert any("killed at the pause deadline" in e["reason"] for e in segue.events(run))
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert_same(segue, run, counter_ref, 400)


def test_ctrl_c_pauses_then_second_stops_at_once(segue: Segue, counter_ref) -> None:
    run = "ctrlc"
    p = segue.popen("run", COUNTER, "--run-id", run, "-p", "n=400", "-p", "sleep=0.004")
    running_pid(segue, run)
    time.sleep(0.2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3, err
    assert segue.status(run)["state"] == "PAUSED"
    assert f"segue resume {run}" in out
    # Second: resume in the foreground, then Ctrl-C twice quickly.
    p = segue.popen("resume", run)
    running_pid(segue, run)
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 3, err
    assert segue.status(run)["state"] == "PAUSED"
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
    segue("run", str(flow), "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004", check=True)
    running_pid(segue, run)
    assert segue("pause", run, "--wait").returncode == 0
    flow.write_text(flow.read_text().replace("return {\"acc2\"", "return {\"acc3\": 0, \"acc2\""))
    proc = segue("resume", run)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"segue: the code of run '{run}' changed since it began (steps 'report' changed); "
        "restore the original file or pass --allow-code-change"
    )
    assert segue.status(run)["state"] == "PAUSED"  # nothing written
    proc = segue("resume", run, "--allow-code-change")
    assert proc.returncode == 0, proc.stderr
    assert segue.output(run, "count")["acc"] == counter_ref(300)["count"]["acc"]
