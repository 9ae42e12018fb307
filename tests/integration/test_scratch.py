"""``ctx.scratch`` with real processes: a step's log file in its scratch directory is saved
with each checkpoint and put back, exactly as it was at that checkpoint, after a SIGKILL
and after a pause; a bad scratch blob is quarantined and the checkpoint before it used,
files and state alike; over its declared size the checkpoint is refused; a step that
declared none is told to declare it. Every wait is on observed progress (a marker file
the held step writes, a checkpoint in the store), never on time.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from segue_helpers import FLOWS, Segue, flow_module, wait_for

from segue import checkpoint as ckpt
from segue.home import Home
from segue.store import Store

FLOW = str(FLOWS / "scratchy.py")
QUICK_RETRY = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
N, EVERY, HOLD_AT = 20, 5, 12  # checkpoints at 5 and 10 before the hold at 12


def lines(n: int) -> str:
    text: str = flow_module("scratchy").expected(n)
    return text


def start(segue: Segue, run: str, gate: Path, **params: Any) -> Store:
    gate.mkdir(exist_ok=True)
    args: list[str] = []
    for k, v in {"n": N, "every": EVERY, "hold_at": HOLD_AT, "gate": gate, **params}.items():
        args += ["-p", f"{k}={v}"]
    segue("run", FLOW, "--run-id", run, "--detach", *args, env=QUICK_RETRY, check=True)
    return Home.resolve(segue.home).open_store()


def held(store: Store, run: str, gate: Path) -> int:
    """Wait until the first attempt holds at HOLD_AT with its checkpoint at 10 committed;
    its worker's pid."""
    wait_for(lambda: list(gate.glob("held-*")), 120, "the step to hold")
    wait_for(lambda: any(c.position == {"i": 10} for c in store.list_checkpoints(run, "grow")),
             60, "the checkpoint at 10")
    task = store.get_task(run, "grow")
    assert task.pid is not None and task.attempts == 1
    return task.pid


def starts(gate: Path) -> list[dict[str, Any]]:
    """What each attempt found at its start, in epoch order."""
    found = sorted(gate.glob("start-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in found]


def test_sigkill_retry_sees_the_file_as_at_the_checkpoint(segue: Segue, tmp_path: Path) -> None:
    run, gate = "k1", tmp_path / "gate"
    store = start(segue, run, gate)
    pid = held(store, run, gate)
    first = starts(gate)[0]
    assert first["files"] == {} and first["dirs"] == []  # a first start: created empty
    scratch = Path(first["scratch"])
    assert scratch.is_relative_to(segue.home / "work" / run / "grow")  # the home's work area
    assert (scratch / "log" / "lines.txt").read_text() == lines(12)  # written past the checkpoint
    os.kill(pid, signal.SIGKILL)  # it holds until killed: this cannot miss
    (gate / "go").touch()
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "SUCCEEDED"

    retry = starts(gate)[1]
    # Exactly the file as it was at checkpoint 10 (lines 11 and 12 were written after it,
    # one of them while that checkpoint may still have been in flight), and the state too.
    assert retry["i"] == 10
    assert retry["files"] == {"log/lines.txt": lines(10)}
    assert retry["dirs"] == ["empty-dir", "log"]
    assert Path(retry["scratch"]) != scratch  # a directory per attempt
    out = segue.output(run, "grow")
    assert out["log"] == lines(N) and out["i"] == N  # no line lost, none twice
    assert not (segue.home / "work" / run).exists()  # attempts' directories removed
    # Each checkpoint's manifest lists its scratch blob with size and checksum.
    storage = Home.resolve(segue.home).storage()
    last = store.list_checkpoints(run, "grow")[0]
    m = ckpt.read_manifest(storage, last.path)
    entry = m.meta["scratch"]["files"]["log/lines.txt"]
    assert m.files[entry["blob"]].size == len(lines(N)) == entry["size"]


def test_pause_and_resume_restore_the_parked_files(segue: Segue, tmp_path: Path) -> None:
    run, gate = "p1", tmp_path / "gate"
    store = start(segue, run, gate)
    held(store, run, gate)
    assert segue("pause", run, "--wait", "--timeout", "60").returncode in (0, 3)
    assert segue.status(run)["state"] == "PAUSED"
    (gate / "go").touch()
    assert segue("resume", run, env=QUICK_RETRY).returncode in (0, 3)
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "SUCCEEDED"
    resumed = starts(gate)[1]
    assert resumed["i"] == HOLD_AT  # the parking checkpoint, files and state
    assert resumed["files"] == {"log/lines.txt": lines(HOLD_AT)}
    assert segue.output(run, "grow")["log"] == lines(N)


def test_a_corrupt_scratch_blob_falls_back_to_the_previous_checkpoint(segue: Segue, tmp_path: Path) -> None:
    run, gate = "c1", tmp_path / "gate"
    store = start(segue, run, gate)
    held(store, run, gate)
    assert segue("pause", run, "--wait", "--timeout", "60").returncode in (0, 3)
    newest = store.list_checkpoints(run, "grow")[0]
    assert newest.position == {"i": HOLD_AT}
    storage = Home.resolve(segue.home).storage()
    listing = ckpt.read_manifest(storage, newest.path).meta["scratch"]
    blob = segue.home / "data" / listing["files"]["log/lines.txt"]["blob"]
    raw = bytearray(blob.read_bytes())
    raw[3] ^= 0x01  # one flipped bit in the parked file's blob
    os.chmod(blob, 0o644)
    blob.write_bytes(bytes(raw))
    (gate / "go").touch()
    assert segue("resume", run, env=QUICK_RETRY).returncode in (0, 3)
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "SUCCEEDED"

    resumed = starts(gate)[1]
    assert resumed["i"] == 10 and resumed["files"] == {"log/lines.txt": lines(10)}
    statuses = {c.seq: c.status for c in store.list_checkpoints(
        run, "grow", statuses=("committed", "quarantined", "pruned"))}
    assert statuses[newest.seq] == "quarantined"
    warned = [e["reason"] for e in segue.events(run) if e["kind"] == "warning"]
    assert any(f"checkpoint {newest.seq} of step 'grow' failed verification" in w
               and "checksum mismatch" in w for w in warned), warned
    assert segue.output(run, "grow")["log"] == lines(N)


def test_over_the_declared_size_the_checkpoint_is_refused(segue: Segue, tmp_path: Path) -> None:
    run, gate = "big", tmp_path / "gate"
    store = start(segue, run, gate, big=70_000, hold_at=0)
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "FAILED"
    err = segue.step(run, "grow")["error"]
    assert "\n" not in err
    assert err.startswith("ScratchTooLargeError: ctx.scratch of step 'grow' holds 70.0 kB "), err
    assert "over its limit of 64.0 kB (64000 bytes)" in err and "scratch=" in err, err
    assert store.list_checkpoints(run, "grow") == []  # nothing written
    assert store.get_task(run, "grow").attempts == 1  # a retry would only grow it again


def test_undeclared_scratch_is_one_line(segue: Segue, tmp_path: Path) -> None:
    run, gate = "u1", tmp_path / "gate"
    start(segue, run, gate, big=-1, hold_at=0, n=5)
    assert segue.wait_state(run, {"SUCCEEDED", "FAILED"}, 180)["state"] == "FAILED"
    err = segue.step(run, "nosy")["error"]
    assert err == ("UsageError: step 'nosy' declares no scratch directory; declare its size "
                   "with @flow.step(scratch=\"2GB\") to use ctx.scratch"), err
