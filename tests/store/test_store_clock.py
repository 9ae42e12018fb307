"""The store's clock seam: every lease and expiry follows the clock it is given.

Lease tests run in virtual time (no sleeps), so they cannot flake on a loaded
machine; the same seam reaches other processes through SEGUE_CLOCK_FILE.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from _store_helpers import make_run
from segue_helpers import VirtualClock

from segue.states import Actor, RunState, TaskState
from segue.store import SQLiteStore
from segue.store.base import now


def test_leases_are_stamped_and_expire_on_the_given_clock(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = SQLiteStore(tmp_path / "segue.db", clock=clock)
    make_run(store)
    store.acquire_controller("r1", pid=1, host="h", ttl_s=10)
    run = store.get_run("r1")
    assert run.controller_lease_until == clock() + 10
    assert run.controller_alive(clock())
    clock.advance(10.5)
    assert not store.get_run("r1").controller_alive(clock())
    # An expired lease can be taken without stealing: the store itself judged it by its clock.
    assert store.acquire_controller("r1", pid=2, host="h2", ttl_s=10) == 2

    store.transition_run("r1", RunState.RUNNING, actor=Actor.CONTROLLER, reason="go")
    t = store.start_attempt("r1", "train", ttl_s=5, actor=Actor.CONTROLLER)
    assert t.lease_until == clock() + 5 and t.started_at == clock()
    clock.advance(3)
    hb = store.heartbeat("r1", "train", t.epoch, ttl_s=5)
    assert hb.lease_until == clock() + 5
    assert store.get_task("r1", "train").updated_at == clock()
    ev = store.list_events("r1")[-1]
    assert ev.time <= clock() and ev.time >= clock() - 3  # events are stamped on the same clock
    store.close()


def test_clock_file_moves_time_for_every_process(tmp_path: Path, monkeypatch) -> None:
    clock = VirtualClock(tmp_path / "clock")
    monkeypatch.setenv("SEGUE_CLOCK_FILE", str(clock.path))
    assert abs(now() - time.time()) < 5
    clock.advance(3600)
    assert 3590 < now() - time.time() < 3610
    code = "from segue.store.base import now; import time; print(now() - time.time())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"SEGUE_CLOCK_FILE": str(clock.path), "PATH": ""}).stdout
    assert 3590 < float(out) < 3610
    # The store in this process follows the file too: a lease taken now expires an hour "later".
    store = SQLiteStore(tmp_path / "segue.db")
    make_run(store)
    store.acquire_controller("r1", pid=1, host="h", ttl_s=60)
    lease = store.get_run("r1").controller_lease_until
    assert lease is not None and lease > time.time() + 3000
    store.close()


def test_task_lease_expiry_is_judged_without_sleeping(tmp_path: Path) -> None:
    """A stale heartbeat is caught the instant virtual time passes the lease."""
    clock = VirtualClock()
    store = SQLiteStore(tmp_path / "segue.db", clock=clock)
    make_run(store)
    t = store.start_attempt("r1", "train", ttl_s=30, actor=Actor.CONTROLLER)
    rec = store.get_task("r1", "train")
    assert rec.state == TaskState.RUNNING and rec.lease_until is not None
    clock.advance(29.9)
    assert rec.lease_until > clock()
    clock.advance(0.2)
    assert rec.lease_until < clock()  # what the controller's check compares, on the same clock
    assert store.heartbeat("r1", "train", t.epoch, ttl_s=30).lease_until == clock() + 30
    store.close()
