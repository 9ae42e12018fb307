"""What the CLI says about a run's processes, and what it prints.

- A controller on this host whose pid is gone is dead at once: `status` says
  so and `resume` takes the run over without waiting for the lease (a long
  SEGUE_LEASE_TTL_S makes the difference decisive, with no timing threshold).
- SIGTERM is named as SIGTERM in the run's events, not as ctrl-c.
- `resume --detach` prints the run id, like `run --detach`.
- Progress says what it counts, humanised.
"""

from __future__ import annotations

import os
import signal

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
from segue.cli.render import human_bytes, progress_text

COUNTER = str(FLOWS / "counter.py")
LONG_LEASE = {"SEGUE_LEASE_TTL_S": "60"}


def _progress(segue: Segue, run: str) -> float:
    return segue.step(run, "count")["progress"]["done"] or 0.0


@pytest.mark.timeout(900)
def test_sigkilled_local_controller_is_dead_now_and_resume_does_not_wait(segue: Segue) -> None:
    run = "lease"
    proc = segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=100000", "-p", "sleep=0.01",
                 env=LONG_LEASE)
    assert proc.returncode == 0, proc.stderr
    wait_for(lambda: _progress(segue, run) >= 5, 120, "progress")
    doc = segue.status(run)
    assert doc["controller"]["alive"] is True
    pid, lease_until = doc["controller"]["pid"], doc["controller"]["lease_until"]
    worker = doc["steps"][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid), 30, "the controller to die")

    doc = segue.status(run)
    assert doc["controller"]["alive"] is False  # at once: its pid is gone on this host
    assert doc["controller"]["lease_until"] == lease_until  # though its lease still runs

    proc = segue("resume", run, "--detach", env=LONG_LEASE)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == run  # the same as `run --detach` prints
    assert proc.stderr.strip().startswith("controller pid ")

    def stolen() -> dict | None:
        return next((e for e in segue.events(run) if e["reason"] == "controller lease stolen"), None)

    ev = wait_for(stolen, 120, "the new controller to take the run")
    # Decisive: the new controller took over while the dead one's lease was
    # still running (60 s), and the lost worker's attempt was reclaimed too.
    assert ev["time"] < lease_until
    assert ev["data"]["stolen_from"]["pid"] == pid
    lost = wait_for(lambda: next((e for e in segue.events(run)
                                  if "attempt lost with its controller" in e["reason"]), None), 120,
                    "the orphaned attempt to be reclaimed")
    assert lost["time"] < lease_until
    wait_for(lambda: segue.step(run, "count")["attempts"] == 2 and
             segue.status(run)["controller"]["alive"], 120, "the second attempt")
    assert not pid_alive(worker)
    segue("cancel", run, check=True)
    segue.wait_state(run, {"CANCELLED"})


def test_a_pid_that_came_back_as_a_thread_is_not_alive() -> None:
    """Thread ids share the pid space: a dead process's pid that wrapped around to some
    process's thread must not count as that process alive (its signal 0 succeeds)."""
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c",
                              "import threading, time\n"
                              "t = threading.Thread(target=lambda: (print(threading.get_native_id(), flush=True),"
                              " time.sleep(60)), daemon=True)\n"
                              "t.start(); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        tid = int(child.stdout.readline())
        os.kill(tid, 0)  # the kernel answers for a thread id as for a pid
        assert tid != child.pid and not pid_alive(tid)
        assert pid_alive(child.pid)
    finally:
        child.kill()
        child.communicate()
    assert not pid_alive(child.pid)


def test_sigterm_is_named_in_the_events(segue: Segue) -> None:
    run = "term"
    fg = segue.popen("run", COUNTER, "--run-id", run, "-p", "n=100000", "-p", "sleep=0.01")
    try:
        wait_for(lambda: segue.status(run)["steps"][0]["state"] == "RUNNING"
                 if segue.home.exists() and segue("status", run).returncode == 0 else False,
                 120, "the run to start")
        wait_for(lambda: _progress(segue, run) >= 3, 120, "progress")
        fg.send_signal(signal.SIGTERM)
        out, err = fg.communicate(timeout=120)
    finally:
        if fg.poll() is None:
            fg.kill()
            fg.wait()
    assert fg.returncode == 3, out + err
    reasons = [e["reason"] for e in segue.events(run)]
    assert "SIGTERM: pausing at the next pause point" in reasons
    assert not any("ctrl-c" in r for r in reasons)


def test_progress_names_its_unit_and_is_humanised(segue: Segue) -> None:
    assert progress_text(2164232, 7748446.0, "bytes") == "2.2 MB / 7.7 MB (28%)"
    assert progress_text(2164232, 7748446.0, "records") == "2,164,232 / 7,748,446 records (28%)"
    assert progress_text(150.0, 300.0) == "150 / 300 (50%)"
    assert progress_text(1.5, None) == "1.50"
    assert progress_text(None, 10.0) == "-"
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000_000) == "1.5 GB"
    segue("run", COUNTER, "--run-id", "p", "-p", "n=40", "-p", "sleep=0", check=True)
    line = next(x for x in segue("status", "p").stdout.splitlines() if x.strip().startswith("count"))
    assert "progress 40 / 40 (100%)" in line and "40/40.0" not in line
