"""A separate process for the race tests: ``python _store_race_worker.py MODE TARGET [ARG]``.

TARGET is the store's SQLite path or PostgreSQL URL. The racing modes print
``ready`` once set up and wait for a line on stdin, so the test releases
every racer at the same instant (a handshake, not a clock); then each does
its part and prints one JSON line with what it saw.

``serve`` answers commands instead: one JSON line in (``[method, args,
kwargs]``), one JSON line out (``{"ok": ...}`` or ``{"error": class name,
"message": ...}``), until stdin closes. ``IDLE_IN_TX_TIMEOUT_S`` sets the
PostgreSQL store's. With ``PAUSE_AT=POINT`` in its
environment it stops itself (SIGSTOP) the first time its store passes that
fault point, and goes on where it was once continued (the ``stop`` action of
SEGUE_FAULTS raises after the stop instead: a write it cut off would never
reach its COMMIT).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time

from _store_helpers import make_run, open_target

from segue.errors import ControllerConflictError, FencedError, IllegalTransitionError, SegueError
from segue.states import Actor, TaskState
from segue.store import Store


def _ready() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def acquire(store: Store) -> dict:
    _ready()
    try:
        epoch = store.acquire_controller("r1", pid=os.getpid(), host="racer", ttl_s=60)
        return {"won": True, "epoch": epoch, "pid": os.getpid()}
    except ControllerConflictError:
        return {"won": False, "pid": os.getpid()}


def attempts(store: Store, rounds: int) -> dict:
    """Take the task over and over; commit a checkpoint and hand the task back each time."""
    _ready()
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


def open_fresh(target: str, run_id: str) -> dict:
    _ready()
    store = open_target(target)  # the race is in opening (and migrating) a fresh store
    make_run(store, run_id)
    return {"ok": True, "runs": len(store.list_runs())}


def _pause_at(point: str) -> None:
    from segue.store import postgres, postgres_schema

    armed = [True]

    def pause(name: str) -> None:
        if name == point and armed[0]:
            armed[0] = False
            os.kill(os.getpid(), signal.SIGSTOP)

    # Each module calls the fault_point it imported by name.
    postgres.fault_point = postgres_schema.fault_point = pause  # type: ignore[assignment]


def serve(target: str) -> None:
    if os.environ.get("PAUSE_AT"):
        _pause_at(os.environ["PAUSE_AT"])
    if os.environ.get("IDLE_IN_TX_TIMEOUT_S"):
        from segue.store import postgres

        postgres.IDLE_IN_TX_TIMEOUT_S = float(os.environ["IDLE_IN_TX_TIMEOUT_S"])
    store = open_target(target)
    print("ready", flush=True)
    for line in sys.stdin:
        method, args, kwargs = json.loads(line)
        try:
            result = getattr(store, method)(*args, **kwargs)
            out = {"ok": dataclasses.asdict(result) if dataclasses.is_dataclass(result) else result}
        except SegueError as e:
            out = {"error": type(e).__name__, "message": str(e)}
        print(json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    mode, target = sys.argv[1], sys.argv[2]
    if mode == "open":
        out = open_fresh(target, sys.argv[3])
    elif mode == "start":  # run with SEGUE_FAULTS set to kill it mid-write
        open_target(target).start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
        out = {"survived": True}
    elif mode == "acquire":
        out = acquire(open_target(target))
    elif mode == "attempts":
        out = attempts(open_target(target), int(sys.argv[3]))
    elif mode == "serve":
        serve(target)
        raise SystemExit(0)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(json.dumps(out))
