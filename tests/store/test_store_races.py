"""Stores under real concurrency, on every backend: several processes, and several threads."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _store_helpers import BACKENDS, make_run, open_target

from segue.errors import FencedError
from segue.states import Actor, TaskState
from segue.store import Store, open_store

WORKER = Path(__file__).with_name("_store_race_worker.py")
N = 5
each_backend = pytest.mark.parametrize("target", BACKENDS, indirect=True)
each_store = pytest.mark.parametrize("store", BACKENDS, indirect=True)


def _race(mode: str, target: str, args: list[list[str]]) -> list[dict]:
    """Start one worker per args entry; release them all at once when every one is ready."""
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), mode, target, *a],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for a in args
    ]
    try:
        for p in procs:  # the handshake: each has started up and built what it needs
            assert p.stdout is not None and p.stdout.readline().strip() == "ready", p.stderr
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outputs = [(p, *p.communicate(timeout=120)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, _, err in outputs:
        assert p.returncode == 0, err
    return [json.loads(out.strip().splitlines()[-1]) for _, out, _ in outputs]


@each_backend
def test_racing_controllers_exactly_one_wins(target: str) -> None:
    store = open_target(target)
    make_run(store)
    results = _race("acquire", target, [[] for _ in range(N)])
    winners = [r for r in results if r["won"]]
    assert len(winners) == 1 and winners[0]["epoch"] == 1
    run = store.get_run("r1")
    assert (run.controller_epoch, run.controller_pid) == (1, winners[0]["pid"])
    assert [e.kind for e in store.list_events("r1")].count("controller") == 1
    store.close()


@each_backend
def test_racing_attempts_get_unique_epochs_and_only_current_ones_commit(target: str) -> None:
    store = open_target(target)
    make_run(store)
    results = _race("attempts", target, [["15"] for _ in range(N)])
    assert sum(1 for r in results if r["epochs"]) >= 2, results  # they really did race
    epochs = [e for r in results for e in r["epochs"]]
    final = store.get_task("r1", "train")
    # Every start_attempt got its own epoch, and none was lost or repeated.
    assert sorted(epochs) == list(range(1, final.epoch + 1))
    assert final.attempts == final.epoch
    # Replay the log: a checkpoint is only ever committed by the newest attempt.
    current = 0
    for ev in store.list_events("r1"):
        if ev.kind == "task" and ev.to_state == "RUNNING":
            assert ev.data["epoch"] == current + 1
            current = ev.data["epoch"]
        elif ev.kind == "checkpoint":
            assert ev.data["epoch"] == current
    committed = store.list_checkpoints("r1", "train")
    assert sorted(s for r in results for _, s in r["commits"]) == sorted(c.seq for c in committed)
    assert [c.seq for c in committed] == sorted((c.seq for c in committed), reverse=True)
    # Afterwards only the newest epoch may commit.
    if final.state is not TaskState.RUNNING:
        store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    newest = store.get_task("r1", "train").epoch
    top = committed[0].seq if committed else 0
    for stale in range(1, newest):
        with pytest.raises(FencedError):
            store.commit_checkpoint("r1", "train", stale, seq=top + 1, path="x",
                                    position=None, nbytes=0)
    rec = store.commit_checkpoint("r1", "train", newest, seq=top + 1, path="x",
                                  position=None, nbytes=0)
    assert rec.epoch == newest
    store.close()


@each_backend
def test_processes_opening_a_fresh_database_at_once(target: str) -> None:
    results = _race("open", target, [[f"r{i}"] for i in range(N)])
    assert all(r["ok"] for r in results)
    store = open_target(target)
    assert sorted(r.run_id for r in store.list_runs()) == [f"r{i}" for i in range(N)]
    store.close()


@each_store
def test_threads_share_a_store_with_a_connection_each(store: Store) -> None:
    make_run(store)
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(20):
                store.append_event("r1", "note", actor=Actor.API, reason=f"{k}-{i}")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            store.close()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    notes = [e for e in store.list_events("r1") if e.kind == "note"]
    assert len(notes) == 80 and len({e.id for e in notes}) == 80
    for k in range(4):  # each thread's events stay in its own order
        mine = [int(e.reason.split("-")[1]) for e in notes if e.reason.startswith(f"{k}-")]
        assert mine == list(range(20))


@each_store
def test_store_is_rebuilt_from_its_target_when_pickled(store: Store) -> None:
    make_run(store)
    copy = pickle.loads(pickle.dumps(store))
    assert copy is not store and type(copy) is type(store) and repr(copy) == repr(store)
    assert copy.get_run("r1") == store.get_run("r1")
    copy.close()


def test_open_store_creates_the_home(tmp_path: Path) -> None:  # SQLite only: a home's file
    home = tmp_path / "a" / "home"
    store = open_store(home)
    make_run(store)
    assert (home / "segue.db").is_file()
    store.close()
    again = open_store(home)
    assert [r.run_id for r in again.list_runs()] == ["r1"]
    again.close()


@each_store
def test_close_then_reuse_reopens(store: Store) -> None:
    make_run(store)
    store.close()
    store.close()  # idempotent
    assert store.get_run("r1").run_id == "r1"
    store.close()
