"""A write cut off before COMMIT leaves nothing behind: no row, no event, no lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _store_helpers import BACKENDS, make_run, open_target, snapshot

from segue import _faults
from segue.errors import InjectedFault
from segue.states import Actor, TaskState
from segue.store import Store

WORKER = Path(__file__).with_name("_store_race_worker.py")


@pytest.mark.parametrize("target", BACKENDS, indirect=True)
def test_process_killed_before_commit_leaves_no_trace(target: str) -> None:
    store = open_target(target)
    make_run(store)
    before = snapshot(store)
    env = {**os.environ, "SEGUE_FAULTS": "store.before_commit:kill"}
    proc = subprocess.run(
        [sys.executable, str(WORKER), "start", target],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert snapshot(store) == before
    # The dead writer's lock went with it: the next write does not wait.
    t0 = time.monotonic()
    rec = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    assert (rec.state, rec.epoch) == (TaskState.RUNNING, 1)
    assert time.monotonic() - t0 < 5
    store.close()


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
def test_error_before_commit_rolls_back(store: Store) -> None:
    make_run(store)
    before = snapshot(store)
    _faults.rearm("store.before_commit:raise")
    try:
        with pytest.raises(InjectedFault):
            store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    finally:
        _faults.rearm("")
    assert snapshot(store) == before
    assert store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch == 1
