"""A separate process for the race tests: ``python _store_race_worker.py MODE DB START_AT [ARG]``.

It waits until the wall clock reaches START_AT (so that all racers start
together), does its part, and prints one JSON line with what it saw.
"""

from __future__ import annotations

import json
import os
import sys
import time

from _store_helpers import make_run

from segue.errors import ControllerConflictError, FencedError, IllegalTransitionError
from segue.states import Actor, TaskState
from segue.store import SQLiteStore


def acquire(db: str) -> dict:
    store = SQLiteStore(db)
    _wait()
    try:
        epoch = store.acquire_controller("r1", pid=os.getpid(), host="racer", ttl_s=60)
        return {"won": True, "epoch": epoch, "pid": os.getpid()}
    except ControllerConflictError:
        return {"won": False, "pid": os.getpid()}


def attempts(db: str, rounds: int) -> dict:
    """Take the task over and over; commit a checkpoint and hand the task back each time."""
    store = SQLiteStore(db)
    _wait()
    epochs, commits, fenced = [], [], 0
    for i in range(rounds):
        try:
            epoch = store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch
        except IllegalTransitionError:
            # Someone else's attempt holds the task: declare it lost, as a
            # failure detector would, and try again next round.
            try:
                store.transition_task("r1", "train", TaskState.PENDING,
                                      actor=Actor.FAILURE_DETECTOR, reason="race",
                                      only_from={TaskState.RUNNING})
            except IllegalTransitionError:
                pass
            continue
        epochs.append(epoch)
        time.sleep(0.001)  # widen the window in which another process can take over
        try:
            # Epochs are unique and rising, so this seq rises along every
            # sequence of commits that the fence lets through.
            seq = epoch * 1000 + i
            store.commit_checkpoint("r1", "train", epoch, seq=seq, path=f"c/{seq}",
                                    position={"pid": os.getpid()}, nbytes=1)
            commits.append([epoch, seq])
        except FencedError:
            fenced += 1
            continue
        try:
            store.transition_task("r1", "train", TaskState.PENDING, actor=Actor.WORKER,
                                  reason="hand back", epoch=epoch)
        except FencedError:
            fenced += 1
        except IllegalTransitionError:
            pass  # a failure detector already handed it back (PENDING -> PENDING)
    return {"epochs": epochs, "commits": commits, "fenced": fenced}


def open_fresh(db: str, run_id: str) -> dict:
    _wait()
    store = SQLiteStore(db)
    make_run(store, run_id)
    return {"ok": True, "runs": len(store.list_runs())}


def _wait() -> None:
    delay = float(sys.argv[3]) - time.time()
    if delay > 0:
        time.sleep(delay)


if __name__ == "__main__":
    mode, db = sys.argv[1], sys.argv[2]
    if mode == "acquire":
        out = acquire(db)
    elif mode == "attempts":
        out = attempts(db, int(sys.argv[4]))
    elif mode == "start":  # run with SEGUE_FAULTS set to kill it mid-write
        SQLiteStore(db).start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
        out = {"survived": True}
    elif mode == "open":
        out = open_fresh(db, sys.argv[4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(out))
