"""`segue verify` proves a correct flow unchanged under faults, and catches a leaky one.

It counts the faults that landed, fails when fewer landed than asked, and
whatever ends it (SIGTERM, SIGINT, SIGKILL) takes its controllers, workers
and sandbox with it.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
from segue.verify.reaper import marked_pids

STUCK = str(FLOWS / "stuck_progress.py")


@pytest.mark.timeout(900)  # two runs of the flow and every restart, on a loaded box
def test_verify_passes_for_a_checkpointed_flow(segue: Segue) -> None:
    # 15 s of work: progress is flushed about once a second, so every planned
    # point (5-90% of the work) is seen while the run still runs.
    proc = segue("verify", str(FLOWS / "counter.py"), "-p", "n=1500", "-p", "sleep=0.01",
                 "--kills", "4", "--pauses", "1", "--seed", "2", "--json", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["identical"] is True and doc["enough_faults"] is True
    # Faults fire at points of the run's progress, so all five land on any machine.
    assert sum(doc["faults_planned"].values()) == 5
    assert doc["faults_landed"] == doc["faults_planned"], doc["faults_missed"]
    kills = [f for f in doc["faults"] if f["kind"] in ("worker", "controller")]
    assert len(kills) == 4 and all(f["landed"] and f["pid"] for f in kills)
    assert doc["records_lost"] == doc["records_duplicated"] == doc["records_differing"] == 0
    assert doc["differing_step_outputs"] == []


@pytest.mark.timeout(900)  # two runs of the flow and every restart, on a loaded box
def test_verify_fails_when_fewer_faults_land_than_asked(segue: Segue, tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    proc = segue("verify", STUCK, "--kills", "3", "--pauses", "0", "--json", "--keep", str(keep),
                 timeout=600)
    doc = json.loads(proc.stdout)
    # The premise: the clean run reported progress 0 of 10, so faults wait for progress.
    conn = sqlite3.connect(keep / "clean" / ".segue" / "segue.db")
    assert conn.execute("SELECT progress_total FROM tasks").fetchall() == [(10.0,)]
    conn.close()
    assert doc["identical"] is True  # the outputs agree, but that proves nothing here
    assert sum(doc["faults_planned"].values()) == 3 and doc["faults_landed"] == {}
    assert [f["landed"] for f in doc["faults"]] == [False, False, False]
    assert all("before it got there" in f["why"] for f in doc["faults_missed"])
    assert doc["enough_faults"] is False and doc["ok"] is False
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "segue: only 0 of 3 faults landed (needed 3); use a longer run or allow fewer with --min-faults")

    proc = segue("verify", STUCK, "--kills", "3", "--pauses", "0", "--min-faults", "0", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "landed 0 {}, needed 0" in proc.stdout


def _sandboxes(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("segue-verify-*"))


@pytest.mark.timeout(900)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["SIGTERM", "SIGINT", "SIGKILL"])
def test_stopping_verify_leaves_no_controller_and_no_sandbox(segue: Segue, tmp_path: Path,
                                                            sig: signal.Signals) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**segue.env, "TMPDIR": str(tmp)}  # the sandbox (mkdtemp) lands where we can see it
    proc = subprocess.Popen([sys.executable, "-m", "segue", "verify", STUCK, "-p", "sleep=0.5",
                             "-p", "hang=true", "--kills", "0", "--pauses", "0"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Wait until the faulted run's detached controller drives a running worker.
        faulted = Segue(Path("/nonexistent"))

        def driven() -> dict | None:
            boxes = _sandboxes(tmp)
            if not boxes or not (boxes[0] / "faulted" / ".segue" / "segue.db").exists():
                return None
            faulted.env["SEGUE_HOME"] = str(boxes[0] / "faulted" / ".segue")
            got = faulted("status", "verify-faulted", "--json")
            if got.returncode != 0:
                return None
            doc = json.loads(got.stdout)
            step = doc["steps"][0]
            ok = doc["controller"]["alive"] and step["state"] == "RUNNING" and step["pid"]
            return doc if ok else None

        doc = wait_for(driven, 300, "the faulted run's controller and worker")
        box = _sandboxes(tmp)[0]
        controller, worker = doc["controller"]["pid"], doc["steps"][0]["pid"]
        assert pid_alive(controller) and pid_alive(worker)
        assert {controller, worker} <= set(marked_pids(str(box)))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
        # Nothing in verify ran: its watchdog saw the pipe close and reaps.
        wait_for(lambda: not box.exists() and not marked_pids(str(box)), 120,
                 "the watchdog to reap the sandbox")
    else:
        assert proc.returncode == 128 + sig, err
        assert err.strip().splitlines()[-1] == (
            f"segue: verify stopped by {sig.name}; its controllers and workers were killed "
            "and its sandbox removed")
        assert not box.exists()  # done before verify exited: no waiting
        assert marked_pids(str(box)) == []
    assert not pid_alive(controller) and not pid_alive(worker)
    assert _sandboxes(tmp) == []
    assert not os.listdir(tmp)


@pytest.mark.timeout(900)  # two runs of the flow and every restart, on a loaded box
def test_verify_catches_duplicates_from_an_unprotected_side_effect(segue: Segue) -> None:
    proc = segue("verify", str(FLOWS / "leaky.py"), "-p", "n=300", "--kills", "4", "--pauses", "0",
                 "--seed", "1", "--json", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is False
    assert doc["records_duplicated"] > 0 and doc["records_lost"] == 0
    assert doc["records_compared"] == 300


def test_verify_rejects_bad_input_before_running(segue: Segue, tmp_path) -> None:
    proc = segue("verify", str(tmp_path / "missing.py"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("segue: flow file ")
    proc = segue("verify", str(FLOWS / "counter.py"), "-p", "n=x")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "segue: parameter 'n' expects int, got 'x'; pass --param n=<int>"
    proc = segue("verify", str(FLOWS / "counter.py"), "--kills", "1", "--pauses", "0",
                 "--min-faults", "2")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "segue: --min-faults must be from 0 to --kills + --pauses (1)"
