"""Crashes at every phase of a save: a real process is SIGKILLed, then we recover.

Checkpoint N is published; a child process saves N+1 and is killed at one fault
point. Afterwards N+1 must be used if and only if the kill came after publishing,
and nothing half-written may ever verify.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from segue.checkpoint import (
    LocalStorage,
    latest_valid,
    list_dir_checkpoints,
    load,
    save,
    verify,
)
from segue.checkpoint.retention import collect_garbage, temp_files
from segue.checkpoint.storage import TEMP_MARK
from segue.errors import CheckpointCorruptError, InjectedFault

# point -> is checkpoint N+1 published when a crash hits there?
POINTS = {
    "checkpoint.start": False,
    "checkpoint.blob_tmp": False,  # a blob is durable under its temp name, not renamed
    "checkpoint.blob_written": False,
    "checkpoint.manifest_tmp": False,
    "checkpoint.published": True,
}

CHILD = """
import sys
import numpy as np
from segue.checkpoint import LocalStorage, save
step = int(sys.argv[2])
save(LocalStorage(sys.argv[1]), f"run/ckpt-{step:04d}",
     {"step": step, "w": np.full((64, 64), step, dtype=np.float32),
      "big": np.full(300_000, step, dtype=np.float32), "extra": {1, 2}},
     meta={"step": step}, allow_pickle=True)
"""


def state(step: int) -> dict[str, object]:
    return {
        "step": step,
        "w": np.full((64, 64), step, dtype=np.float32),
        "big": np.full(300_000, step, dtype=np.float32),
        "extra": {1, 2},
    }


def recover(storage: LocalStorage) -> tuple[str | None, list[str]]:
    """What a resuming controller does: newest first, report the bad ones."""
    bad: list[str] = []
    candidates = ["run/ckpt-0002", *reversed(list_dir_checkpoints(storage, "run"))]
    best = latest_valid(storage, list(dict.fromkeys(candidates)), on_bad=lambda p, e: bad.append(p))
    return best, bad


@pytest.mark.parametrize("point", sorted(POINTS))
def test_sigkill_at_each_phase_never_exposes_a_half_checkpoint(tmp_path: Path, point: str) -> None:
    storage = LocalStorage(tmp_path)
    save(storage, "run/ckpt-0001", state(1), allow_pickle=True)
    env = {**os.environ, "SEGUE_FAULTS": f"{point}:kill"}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), "2"], env=env, capture_output=True, timeout=60
    )
    assert proc.returncode == -9, proc.stderr.decode()

    published = POINTS[point]
    left = storage.listdir("run/ckpt-0002")
    # While the blobs are made durable, the manifest is staged beside its name: a kill
    # then may leave its temp file (never read), never the manifest.
    staged = [n for n in left if n.startswith(f".MANIFEST.json{TEMP_MARK}")]
    if point == "checkpoint.blob_tmp":  # a temp blob, never read, and no manifest
        assert temp_files(storage) and left == staged
    if point == "checkpoint.blob_written":  # data durable in blobs/, no manifest yet
        assert left == staged and not temp_files(storage)
    if point == "checkpoint.manifest_tmp":  # the manifest exists only under its temp name
        assert staged and "MANIFEST.json" not in left
    best, bad = recover(storage)
    assert best == ("run/ckpt-0002" if published else "run/ckpt-0001")
    assert bad == ([] if published else ["run/ckpt-0002"])
    assert list_dir_checkpoints(storage, "run") == (
        ["run/ckpt-0001", "run/ckpt-0002"] if published else ["run/ckpt-0001"]
    )
    assert load(storage, best, allow_pickle=True).state["step"] == (2 if published else 1)
    if not published:
        # GC removes every temp file of the dead writer, its staged manifest's too.
        gc = collect_garbage(storage, grace_s=0)
        assert set(gc.deleted) >= {f"run/ckpt-0002/{n}" for n in staged}
        assert not [i.path for i in storage.walk("") if TEMP_MARK in i.path]
        # Leftovers of the dead writer do not block a retry, and the retry verifies.
        save(storage, "run/ckpt-0002", state(2), allow_pickle=True)
        verify(storage, "run/ckpt-0002")
        assert recover(storage) == ("run/ckpt-0002", [])


@pytest.mark.parametrize("point", sorted(POINTS))
def test_raise_at_each_phase_cleans_up(
    tmp_path: Path, point: str, faults: Callable[[str | None], None]
) -> None:
    storage = LocalStorage(tmp_path)
    save(storage, "run/ckpt-0001", state(1), allow_pickle=True)
    faults(f"{point}:raise")
    with pytest.raises(InjectedFault, match=rf"^injected fault at {point}$"):
        save(storage, "run/ckpt-0002", state(2), allow_pickle=True)
    faults("")

    left = storage.listdir("run/ckpt-0002")
    assert not [n for n in left if TEMP_MARK in n] and not temp_files(storage)
    assert storage.listdir("blobs/pending") == []  # the marker goes, whatever happened
    if POINTS[point]:
        assert left == ["MANIFEST.json"]
        assert recover(storage) == ("run/ckpt-0002", [])
    else:
        assert left == []  # nothing half-written remains
        with pytest.raises(CheckpointCorruptError, match=r"\(manifest missing\)$"):
            verify(storage, "run/ckpt-0002")
        assert recover(storage) == ("run/ckpt-0001", ["run/ckpt-0002"])
