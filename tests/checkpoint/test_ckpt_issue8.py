"""Issue 8, checkpoint part: every test here failed before its fix.

1.6  `segue ckpt ls|inspect|verify` on a CheckpointManager directory; nothing
     found is exit 1; a missing path is exit 2 (bad input).
1.9  every_steps=N fires at N, 2N, ... (IntervalPolicy, CheckpointManager, flows).
1.12 `ctx.checkpoint(durable=True)` returns with the checkpoint committed.
1.13 checkpoint format errors are SegueErrors, not ValueErrors.
2.4  a manifest naming a file outside its checkpoint is corrupt: the CLI reports
     it without a traceback, and a run quarantines it and falls back.
2.5  CheckpointManager.restore_latest() raises when every checkpoint is corrupt.
2.6  the fallback warning names the checkpoint used; `segue ckpt verify RUN`
     reports a committed checkpoint whose manifest is gone.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue import checkpoint as ckpt
from segue.checkpoint import CheckpointManager, LocalStorage
from segue.checkpoint.format import FileEntry, Manifest, ManifestFormatError
from segue.checkpoint.interval import IntervalPolicy
from segue.checkpoint.safetensors_io import SafetensorsFormatError, read_safetensors
from segue.errors import (
    CheckpointCorruptError,
    CheckpointFormatError,
    NoValidCheckpointError,
    SegueError,
)
from segue.home import Home

COUNTER = str(FLOWS / "counter.py")
EVERY100 = str(Path(__file__).parent / "flows_ckpt8" / "every100.py")
ESCAPES = ["../../outside.bin", "/etc/hostname"]


def ckpt_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real `segue ckpt` command line, in a fresh process, with a home that is not there."""
    env = {**os.environ, "SEGUE_HOME": str(Path(args[-1]).parent / "no-home")}
    return subprocess.run([sys.executable, "-m", "segue", "ckpt", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def manager_dir(root: Path, steps: range) -> Path:
    with CheckpointManager(root, keep_last=10, every_steps=1) as mgr:
        for s in steps:
            mgr.save(s, {"w": np.full(64, s, dtype=np.float32), "step": s})
    return root


def escape_manifest(storage: ckpt.CheckpointStorage, path: str, name: str) -> None:
    """Rewrite a checkpoint's manifest, with a valid checksum, to also list ``name``."""
    m = ckpt.read_manifest(storage, path)
    bad = dataclasses.replace(m, files={**m.files, name: FileEntry(size=1, xxh3_128="0" * 32)})
    manifest = storage.root / path / "MANIFEST.json"  # type: ignore[attr-defined]
    manifest.write_text(bad.to_json())
    assert name in Manifest.from_json(manifest.read_bytes()).files  # well-formed, checksum ok


# -- 1.9: every_steps fires at multiples ------------------------------------------------


def fired(policy: IntervalPolicy, steps: range) -> list[int]:
    out = []
    for s in steps:
        if policy.due(s):
            out.append(s)
            policy.mark(s)
    return out


def test_every_steps_fires_at_multiples_whatever_the_first_step() -> None:
    assert fired(IntervalPolicy(every_steps=100), range(1, 350)) == [100, 200, 300]
    assert fired(IntervalPolicy(every_steps=100), range(0, 350)) == [100, 200, 300]
    assert fired(IntervalPolicy(every_steps=1), range(1, 4)) == [1, 2, 3]
    assert fired(IntervalPolicy(every_steps=32), range(1, 100)) == [32, 64, 96]
    # A counter that skips (batches of 30) fires at the first step past each multiple.
    assert fired(IntervalPolicy(every_steps=100), range(0, 430, 30)) == [120, 210, 300, 420]
    # A checkpoint off the grid (a pause, "checkpoint now") does not shift the grid.
    p = IntervalPolicy(every_steps=100)
    p.mark(137)
    assert fired(p, range(138, 320)) == [200, 300]
    # After a restore (mark without a step), the first step seen is covered.
    p = IntervalPolicy(every_steps=100)
    p.mark(None)
    assert fired(p, range(100, 320)) == [200, 300]


def test_manager_every_steps_fires_at_multiples_and_after_restore(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, every_steps=100, keep_last=10) as mgr:
        for step in range(1, 250):
            if mgr.due(step):
                mgr.save(step, {"step": step})
        mgr.wait()
        assert mgr.steps() == [100, 200]
    with CheckpointManager(tmp_path, every_steps=100, keep_last=10) as mgr:
        got = mgr.restore_latest()
        assert got is not None and got[0] == 200
        for step in range(got[0], 420):  # restarts at the restored step: not due again
            if mgr.due(step):
                mgr.save(step, {"step": step})
        mgr.wait()
        assert mgr.steps() == [100, 200, 300, 400]


def test_flow_every_steps_fires_at_multiples_across_a_retry(segue: Segue) -> None:
    proc = segue("run", EVERY100, "--run-id", "e100")
    assert proc.returncode == 0, proc.stderr
    st = segue.step("e100", "count")
    assert st["attempts"] == 2  # the planned failure at 150 landed, the retry restored 100
    out = segue.output("e100", "count")
    assert out["fired"] == [100, 200, 300]
    committed = [c["position"]["i"] for c in segue.json("checkpoints", "e100")]
    assert sorted(committed) == [100, 200, 300]
    # 1.12: each checkpoint(durable=True) returned with itself committed in the store
    # (the entry for 100 was appended after it was saved, so the retry lost it).
    assert out["committed_on_return"] == [200, 300]


# -- 1.13: format errors are in the SegueError tree ------------------------------------


def test_format_errors_are_segue_errors_not_value_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFormatError, match=r"^not JSON: "):
        Manifest.from_json(b"{not json")
    with pytest.raises(CheckpointFormatError, match=r"^header length "):
        f = tmp_path / "x.safetensors"
        f.write_bytes((1 << 40).to_bytes(8, "little"))
        with f.open("rb") as fh:
            read_safetensors(fh)
    for cls in (ManifestFormatError, SafetensorsFormatError):
        assert issubclass(cls, SegueError) and not issubclass(cls, ValueError)


# -- 1.6: the CLI on a manager's directory; nothing found; a missing path ---------------


def test_cli_accepts_a_manager_directory(tmp_path: Path) -> None:
    root = manager_dir(tmp_path / "m", range(1, 4))
    ls = ckpt_cli("ls", str(root))
    assert ls.returncode == 0, ls.stderr
    assert [line.split()[0] for line in ls.stdout.splitlines()] == [
        f"checkpoints/step-000000000{i}" for i in (1, 2, 3)
    ]
    ver = ckpt_cli("verify", str(root))
    assert ver.returncode == 0 and ver.stdout.count("ok   checkpoints/step-") == 3, ver
    ins = ckpt_cli("inspect", str(root))
    assert ins.returncode == 0 and ins.stdout.startswith("checkpoints/step-0000000003  format v2")
    # A checkpoint given by a path relative to the current directory.
    one = ckpt_cli("verify", "step-0000000002", cwd=root / "checkpoints")
    assert one.returncode == 0 and one.stdout == "ok   checkpoints/step-0000000002\n", one


def test_cli_nothing_found_is_exit_1_and_a_missing_path_exit_2(tmp_path: Path) -> None:
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    for cmd in ("ls", "inspect", "verify"):
        p = ckpt_cli(cmd, str(tmp_path / "empty"))
        assert p.returncode == 1, (cmd, p)
        assert p.stderr == (f"segue: no checkpoint under {tmp_path}/empty (nor under "
                            f"{tmp_path}/empty/checkpoints); pass a checkpoint or a directory "
                            "of them\n"), (cmd, p.stderr)
        missing = ckpt_cli(cmd, str(tmp_path / "nope"))
        assert missing.returncode == 2 and missing.stdout == "", (cmd, missing)
        assert missing.stderr == (f"segue: {tmp_path}/nope: no such file or directory; pass a "
                                  "checkpoint, a directory of checkpoints, or the directory given "
                                  "to CheckpointManager\n"), missing.stderr
    assert not (tmp_path / "nope").exists()  # nothing written


# -- 2.4: a manifest naming a path outside its checkpoint -------------------------------


@pytest.mark.parametrize("name", ESCAPES)
def test_cli_reports_an_escaping_manifest_without_a_traceback(tmp_path: Path, name: str) -> None:
    root = manager_dir(tmp_path / "m", range(1, 3))
    storage = LocalStorage(root)
    escape_manifest(storage, "checkpoints/step-0000000002", name)
    ver = ckpt_cli("verify", str(root))
    assert ver.returncode == 1 and "Traceback" not in ver.stderr, ver
    assert ver.stdout.splitlines() == [
        "ok   checkpoints/step-0000000001",
        f"BAD  checkpoints/step-0000000002: manifest unreadable: file {name!r} is outside the "
        "checkpoint",
    ]
    for cmd in ("ls", "inspect", "verify"):
        one = ckpt_cli(cmd, str(root / "checkpoints" / "step-0000000002"))
        assert one.returncode == 1 and "Traceback" not in one.stderr, (cmd, one)
        assert "is outside the checkpoint" in one.stdout + one.stderr, (cmd, one)
    assert not Path("/outside.bin").exists() and not (tmp_path / "outside.bin").exists()
    with pytest.raises(CheckpointCorruptError, match=r"is outside the checkpoint\)$"):
        ckpt.load(storage, "checkpoints/step-0000000002")


@pytest.mark.parametrize("name", ESCAPES)
def test_run_quarantines_an_escaping_manifest_and_falls_back(
    segue: Segue, counter_ref: Any, name: str
) -> None:
    run = "escape"
    quick = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}  # if it fails, fast
    gate = segue.home.parent / "hold"  # the run cannot end before the test lets it
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          "-p", f"hold={gate}", env=quick, check=True)
    wait_for(lambda: (c := segue.step(run, "count")["last_checkpoint"]) and c["seq"] >= 3, 60,
             "three checkpoints")
    assert segue("pause", run, "--wait").returncode == 0
    assert segue.step(run, "count")["state"] == "PARKED"  # parked before the end: it restores
    gate.touch()
    home = Home.resolve(segue.home)
    store = home.open_store()
    newest, previous = store.list_checkpoints(run, "count")[:2]
    escape_manifest(home.storage(), newest.path, name)
    proc = segue("resume", run)
    assert proc.returncode == 0, proc.stderr
    assert segue.output(run, "count")["acc"] == counter_ref(300)["count"]["acc"]
    warns = [e for e in segue.events(run) if e["kind"] == "warning"]
    assert len(warns) == 1, warns
    reason = warns[0]["reason"]
    assert reason.startswith(
        f"checkpoint {newest.seq} of step 'count' failed verification (manifest unreadable: "
        f"file {name!r} is outside the checkpoint); using checkpoint {previous.seq} at "
        f"{previous.path}; the bad one was moved to quarantine/"), reason
    assert warns[0]["data"]["used_seq"] == previous.seq
    statuses = {c.seq: c.status for c in store.list_checkpoints(
        run, "count", statuses=("committed", "quarantined", "pruned"))}
    assert statuses[newest.seq] == "quarantined"  # the previous one was pruned later, as usual
    assert list((home.data_dir / "quarantine").iterdir())


# -- 2.5 / 2.6: the manager refuses to start over; warnings name the one used ----------


def test_restore_latest_raises_when_every_checkpoint_is_corrupt(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "fresh") as mgr:
        assert mgr.restore_latest() is None  # no checkpoint yet: a fresh start is right
    root = manager_dir(tmp_path / "m", range(1, 3))
    storage = LocalStorage(root)
    for step in (1, 2):
        (root / f"checkpoints/step-000000000{step}/MANIFEST.json").write_text("{}")
    mgr = CheckpointManager(storage, quarantine_bad=False)
    with pytest.warns(RuntimeWarning) as caught, pytest.raises(
        NoValidCheckpointError,
        match=r"^none of the 2 checkpoints under checkpoints verifies \(checkpoints/step-0000000002"
              r": manifest unreadable: .*; repair them, or call "
              r"restore_latest\(allow_fresh_start=True\) to start over$",
    ):
        mgr.restore_latest()
    assert [str(w.message).split(";")[1] for w in caught] == [" no earlier checkpoint verifies"] * 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert mgr.restore_latest(allow_fresh_start=True) is None
    mgr.close()


def test_ckpt_verify_run_reports_a_committed_checkpoint_without_manifest(segue: Segue) -> None:
    run = "nomanifest"
    gate = segue.home.parent / "hold"  # never created: the run stays unfinished
    segue("run", COUNTER, "--run-id", run, "--detach", "-p", "n=300", "-p", "sleep=0.004",
          "-p", f"hold={gate}", check=True)
    wait_for(lambda: (c := segue.step(run, "count")["last_checkpoint"]) and c["seq"] >= 2, 60,
             "two checkpoints")
    assert segue("pause", run, "--wait").returncode == 0
    home = Home.resolve(segue.home)
    committed = home.open_store().list_checkpoints(run, "count")
    ok = segue("ckpt", "verify", run)
    assert ok.returncode == 0, ok
    assert ok.stdout.count("ok   runs/") == len(committed)
    gone = committed[0]
    (home.data_dir / gone.path / "MANIFEST.json").unlink()
    bad = segue("ckpt", "verify", run)
    assert bad.returncode == 1, bad
    assert (f"BAD  {gone.path}: manifest missing (checkpoint {gone.seq} of step 'count', "
            "committed in the store)") in bad.stdout.splitlines(), bad.stdout
    assert bad.stdout.count("ok   runs/") == len(committed) - 1
