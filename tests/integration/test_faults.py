"""Kill the worker at every phase of a commit; corrupt checkpoints on disk.

Whatever the phase, the run must finish bit-identical to an uninterrupted
one, and a corrupt checkpoint must be quarantined with a warning while the
previous valid one is used.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.home import Home

COUNTER = str(FLOWS / "counter.py")

# Every phase of a checkpoint commit and of the final output commit, in order.
PHASES = [
    "ctx.before_checkpoint:kill:2",
    "checkpoint.start:kill:2",
    "checkpoint.blob_written:kill:2",
    "checkpoint.manifest_tmp:kill:2",
    "checkpoint.published:kill:2",
    "ctx.after_save:kill:2",
    "store.before_commit:kill:3",
    "ctx.after_commit:kill:2",
    "worker.before_complete:kill",
    "worker.after_complete:kill",
]


@pytest.mark.parametrize("fault", PHASES)
def test_kill_at_each_commit_phase(segue: Segue, counter_ref: Any, fault: str) -> None:
    run = "phase"
    env = {"SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": "worker", "SEGUE_FAULTS_EPOCHS": "1",
           "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
    proc = segue("run", COUNTER, "--run-id", run, "-p", "n=150", "-p", "sleep=0.002", env=env)
    assert proc.returncode == 0, proc.stderr
    doc = segue.status(run)
    count = doc["steps"][0]
    # Steps count attempts separately; the fault fires in each step's first attempt.
    if fault.startswith("worker.after_complete"):
        # Killed after its output was committed: the step is done, never re-run.
        assert count["attempts"] == 1
    else:
        assert count["attempts"] == 2, (fault, count)
        reasons = [e["reason"] for e in segue.events(run) if e["actor"] == "failure-detector"]
        assert any("killed by SIGKILL" in r for r in reasons)
    ref = counter_ref(150)
    got = segue.output(run, "count")
    assert got["acc"] == ref["count"]["acc"] and got["i"] == 150
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    # Committed checkpoints all verify; a half-written one never counts.
    home = Home.resolve(segue.home)
    from segue import checkpoint as ckpt

    for c in home.open_store().list_checkpoints(run, "count"):
        ckpt.verify(home.storage(), c.path)


def _largest_file(d: Path) -> Path:
    files = [p for p in d.rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
    return max(files, key=lambda p: p.stat().st_size) if files else d / "MANIFEST.json"


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_corrupt_newest_checkpoint_is_quarantined(segue: Segue, counter_ref: Any, damage: str) -> None:
    run = "corrupt"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004", check=True)
    wait_for(lambda: (c := segue.step(run, "count")["last_checkpoint"]) and c["seq"] >= 3, 30, "checkpoints")
    assert segue("pause", run, "--wait").returncode == 0
    home = Home.resolve(segue.home)
    store = home.open_store()
    newest = store.list_checkpoints(run, "count")[0]
    ckdir = home.data_dir / newest.path
    manifest = ckdir / "MANIFEST.json"
    if damage == "manifest":
        target = manifest
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        # The data may live in shared blobs; damage whatever this checkpoint references.
        from segue import checkpoint as ckpt

        m = ckpt.read_manifest(home.storage(), newest.path)
        rels = sorted(m.files, key=lambda k: -m.files[k].size)
        rel = rels[0]
        target = ckdir / rel if (ckdir / rel).exists() else home.data_dir / rel
        data = bytearray(target.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x01
        else:
            data = data[: len(data) // 2]
        target.write_bytes(bytes(data))
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    ref = counter_ref(300)
    assert segue.output(run, "count")["acc"] == ref["count"]["acc"]
    warnings = [e for e in segue.events(run) if e["kind"] == "warning"]
    assert len(warnings) == 1 and "failed verification" in warnings[0]["reason"]
    assert "quarantine" in warnings[0]["reason"]
    statuses = {c.seq: c.status for c in store.list_checkpoints(run, "count",
                                                                 statuses=("committed", "quarantined"))}
    assert statuses[newest.seq] == "quarantined"
    assert list((home.data_dir / "quarantine").iterdir())


def test_every_checkpoint_corrupt_refuses_fresh_start(segue: Segue) -> None:
    run = "allbad"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004", check=True)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    assert segue("pause", run, "--wait").returncode == 0
    home = Home.resolve(segue.home)
    for c in home.open_store().list_checkpoints(run, "count"):
        (home.data_dir / c.path / "MANIFEST.json").write_text("{}")
    proc = segue("resume", run, env={"SEGUE_BACKOFF_BASE_S": "0.01"})
    assert proc.returncode == 1
    err = segue.status(run)["steps"][0]["error"]
    assert err.startswith("NoValidCheckpointError: step 'count' of run 'allbad': none of its")
    assert "will not start from scratch on its own" in err


def test_torch_rng_resumes_exactly(segue: Segue) -> None:
    pytest.importorskip("torch", reason="torch is not installed; `pip install torch` to run this test")
    flow = str(FLOWS / "torchrng.py")
    ref = Segue(segue.home.parent / "ref")
    ref("run", flow, "--run-id", "r", "-p", "sleep=0", check=True)
    run = "t"
    segue("run", flow, "--run-id", run, "--detach", check=True)
    for _ in range(3):
        pid = wait_for(lambda: (s := segue.step(run, "draw"))["state"] == "RUNNING" and s["pid"]
                       and s["last_checkpoint"] and s["pid"], 60, "draw to run")
        time.sleep(0.15)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    segue.wait_state(run, {"SUCCEEDED"}, 120)
    a, b = ref.output("r", "draw"), segue.output(run, "draw")
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_full_disk_fails_clearly_and_loses_nothing(segue: Segue, counter_ref: Any) -> None:
    run = "full"
    quick = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}  # run options are set here
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=2000", "-p", "sleep=0.004", env=quick,
          check=True)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    assert segue("pause", run, "--wait").returncode == 0
    before = segue.step(run, "count")["last_checkpoint"]
    # The disk is full now: every save fails at its first blob.
    env = {"SEGUE_FAULTS": "checkpoint.blob_written:enospc", "SEGUE_FAULTS_IN": "worker"}
    proc = segue("resume", run, env=env)
    assert proc.returncode == 1
    step = segue.step(run, "count")
    assert step["error"].startswith("disk full: no space left on the device of ")
    assert step["error"].endswith(f"then `segue resume {run}`; committed checkpoints are intact")
    assert step["last_checkpoint"]["seq"] == before["seq"]  # nothing committed, nothing lost
    warnings = [e for e in segue.events(run) if e["kind"] == "warning"]
    assert any("could not be saved (OSError" in e["reason"] for e in warnings)
    proc = segue("resume", run)  # space is back
    assert proc.returncode == 0, proc.stderr
    assert segue.output(run, "count")["acc"] == counter_ref(2000)["count"]["acc"]
