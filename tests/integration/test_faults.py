"""Kill the worker at every phase of a commit; corrupt checkpoints on disk.

Whatever the phase, the run must finish bit-identical to an uninterrupted
one, and a corrupt checkpoint must be quarantined with a warning while the
previous valid one is used.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
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


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("fault", PHASES)
def test_kill_at_each_commit_phase(segue: Segue, counter_ref: Any, fault: str, where: str,
                                   request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kills with the run's checkpoints and outputs on a real S3 API server."""
    run = "phase"
    env = {"SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": "worker", "SEGUE_FAULTS_EPOCHS": "1",
           "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
    extra: tuple[str, ...] = ()
    if where == "s3":
        from s3kit import s3_bucket

        bucket, aws = s3_bucket(request.getfixturevalue("s3_endpoint"))
        env.update(aws)
        for k, v in aws.items():
            monkeypatch.setenv(k, v)  # this process reads the checkpoints below
        extra = ("--checkpoints", f"s3://{bucket}/segue")
    proc = segue("run", COUNTER, "--run-id", run, "-p", "n=150", "-p", "sleep=0.002", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = segue.status(run)
    count = doc["steps"][0]
    # Steps count attempts separately; the fault fires in each step's first attempt.
    if fault.startswith("worker.after_complete"):
        # Killed after its output was committed: the step is done, never re-run.
        assert count["attempts"] == 1
    else:
        assert count["attempts"] == 2, (fault, count)
        # The fault landed: the failure detector saw exactly that one kill of this step.
        assert sigkills(segue, run, "count") == 1
    ref = counter_ref(150)
    got = segue.output(run, "count")
    assert got["acc"] == ref["count"]["acc"] and got["i"] == 150
    np.testing.assert_array_equal(got["hist"], ref["count"]["hist"])
    # Committed checkpoints all verify; a half-written one never counts.
    home = Home.resolve(segue.home)
    from segue import checkpoint as ckpt

    store = home.open_store()
    storage = home.run_storage(store.get_run(run))
    for c in store.list_checkpoints(run, "count"):
        ckpt.verify(storage, c.path)
    if where == "s3":
        # Everything of the run is in the bucket; nothing went to the home's disk.
        assert storage.listdir(f"runs/{run}/count/ckpt")
        assert not (home.data_dir / "runs" / run).exists()


def _largest_file(d: Path) -> Path:
    files = [p for p in d.rglob("*") if p.is_file() and p.name != "MANIFEST.json"]
    return max(files, key=lambda p: p.stat().st_size) if files else d / "MANIFEST.json"


@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_corrupt_newest_checkpoint_is_quarantined(segue: Segue, counter_ref: Any, damage: str, where: str,
                                                  tmp_path: Path, request: pytest.FixtureRequest,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run = "corrupt"
    env, extra = {}, ()
    if where == "s3":
        from s3kit import s3_bucket

        bucket, env = s3_bucket(request.getfixturevalue("s3_endpoint"))
        for k, v in env.items():
            monkeypatch.setenv(k, v)  # this process damages the objects below
        extra = ("--checkpoints", f"s3://{bucket}/segue")
    # The hold keeps the run from finishing before the pause. The run is long (12 s of work)
    # so the pause lands well before the hold: checkpoints taken while held repeat one
    # state, share its blobs, and damaging one would damage them all.
    hold = tmp_path / "hold"
    # On S3 every one of the step's many checkpoints (each 50 ms) is a few requests to the
    # server, which slows the step down: a third of the work keeps it as long.
    n = 3000 if where == "local" else 1000
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", f"n={n}", "-p", "sleep=0.004",
          "-p", f"hold={hold}", *extra, env=env, check=True)
    wait_for(lambda: (c := segue.step(run, "count")["last_checkpoint"]) and c["seq"] >= 3, 30, "checkpoints")
    assert segue("pause", run, "--wait", env=env).returncode == 0
    home = Home.resolve(segue.home)
    store = home.open_store()
    storage = home.run_storage(store.get_run(run))
    newest = store.list_checkpoints(run, "count")[0]
    if damage == "manifest":
        target = f"{newest.path}/MANIFEST.json"
    else:
        # The data may live in shared blobs; damage whatever this checkpoint references.
        from segue import checkpoint as ckpt

        m = ckpt.read_manifest(storage, newest.path)
        rel = sorted(m.files, key=lambda k: -m.files[k].size)[0]
        target = f"{newest.path}/{rel}" if storage.exists(f"{newest.path}/{rel}") else rel
    data = bytearray(storage.read_bytes(target))
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF if damage == "manifest" else 0x01
    with storage.open_write(target) as f:  # a rotten object in place of the good one
        f.write(bytes(data))
    assert storage.read_bytes(target) == bytes(data)  # the damage is there
    hold.write_text("go")
    proc = segue("resume", run, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    ref = counter_ref(n)
    assert segue.output(run, "count")["acc"] == ref["count"]["acc"]
    warnings = [e for e in segue.events(run) if e["kind"] == "warning"]
    assert len(warnings) == 1 and "failed verification" in warnings[0]["reason"]
    assert "quarantine" in warnings[0]["reason"]
    statuses = {c.seq: c.status for c in store.list_checkpoints(run, "count",
                                                                 statuses=("committed", "quarantined"))}
    assert statuses[newest.seq] == "quarantined"
    assert storage.listdir("quarantine")


def test_every_checkpoint_corrupt_refuses_fresh_start(segue: Segue, tmp_path: Path) -> None:
    run = "allbad"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          "-p", f"hold={tmp_path / 'hold'}", check=True)
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


def test_torch_rng_resumes_exactly(segue: Segue, tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is not installed; `pip install torch` to run this test")
    flow = str(FLOWS / "torchrng.py")
    ref = Segue(segue.home.parent / "ref")
    ref("run", flow, "--run-id", "r", "-p", "sleep=0", check=True)
    run = "t"
    hold = tmp_path / "hold"  # the last draw waits for it: the run cannot finish before the kills
    segue("run", flow, "--run-id", run, "--detach", "-p", f"hold={hold}", check=True)
    store = Home.resolve(segue.home).open_store()

    def attempt_checkpointed(not_pid: int | None) -> tuple[int, int] | None:
        t = store.get_task(run, "draw")
        cks = store.list_checkpoints(run, "draw")
        if t.state.value == "RUNNING" and t.pid and t.pid != not_pid and cks and cks[0].epoch == t.epoch:
            return t.pid, t.epoch
        return None

    landed, last = 0, None
    while landed < 3:
        # Gate on observed progress: the attempt to kill has committed a checkpoint.
        pid, _ = wait_for(lambda: attempt_checkpointed(last), 120, "draw to checkpoint")
        if not pid_alive(pid):
            continue
        os.kill(pid, signal.SIGKILL)  # the hold keeps it alive until now: the kill lands
        landed, last = landed + 1, pid
        wait_for(lambda: sigkills(segue, run) >= landed, 60, "the kill to be recorded")
    hold.write_text("go")
    segue.wait_state(run, {"SUCCEEDED"}, 120)
    assert sigkills(segue, run) == landed == 3
    a, b = ref.output("r", "draw"), segue.output(run, "draw")
    assert set(a) == set(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def sigkills(segue: Segue, run: str, step: str | None = None) -> int:
    """SIGKILLs of workers the failure detector recorded: faults that landed."""
    # Transitions only: a failure also leaves a "failure" event with the same words.
    return sum("killed by SIGKILL" in e["reason"] for e in segue.events(run)
               if e["actor"] == "failure-detector" and e["kind"] == "task"
               and (step is None or e.get("step") == step))


def test_full_disk_fails_clearly_and_loses_nothing(segue: Segue, counter_ref: Any,
                                                   tmp_path: Path) -> None:
    run = "full"
    quick = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}  # run options are set here
    hold = tmp_path / "hold"
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=2000", "-p", "sleep=0.004",
          "-p", f"hold={hold}", env=quick, check=True)
    wait_for(lambda: segue.step(run, "count")["last_checkpoint"], 30, "a checkpoint")
    assert segue("pause", run, "--wait").returncode == 0
    before = segue.step(run, "count")["last_checkpoint"]
    # The disk is full now: every save fails at its first blob (every hit, not only the
    # first: a save runs in the background, so the step may start the next ones before
    # the first one's error reaches it).
    env = {"SEGUE_FAULTS": "checkpoint.blob_written:enospc:1-1000000", "SEGUE_FAULTS_IN": "worker"}
    proc = segue("resume", run, env=env)
    assert proc.returncode == 3, proc.stderr  # a full disk pauses the run: nothing to retry
    assert segue.status(run)["state"] == "PAUSED"
    step = segue.step(run, "count")
    assert step["state"] == "PARKED"
    assert step["error"].startswith("disk full writing checkpoint "), step["error"]
    assert step["error"].endswith(f"then `segue resume {run}`; committed checkpoints are intact")
    assert step["last_checkpoint"]["seq"] == before["seq"]  # nothing committed, nothing lost
    warnings = [e for e in segue.events(run) if e["kind"] == "warning"]
    assert any("could not be saved (OSError" in e["reason"] for e in warnings)
    hold.write_text("go")
    proc = segue("resume", run)  # space is back
    assert proc.returncode == 0, proc.stderr
    assert segue.output(run, "count")["acc"] == counter_ref(2000)["count"]["acc"]
