"""A step's progress in the store only moves forward while the attempt runs.

Two threads write it: the heartbeat (every second) and a checkpoint's commit (in
the writer's thread, once the save is durable, which on object storage may be long
after the save began). The commit used to write the progress reported when its save
began, so a slow commit landed an older value over the heartbeat's newer one, and a
step that then waited (at a gate, say) showed the old value for ever. A heartbeat
whose write failed also lost the report it was writing.

The store is real (SQLite) and so is the heartbeat thread; a gate on the store's
commit call decides the order of the two writes, not the machine's speed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from segue_helpers import FLOWS, wait_for

from segue.home import Home
from segue.run import ops
from segue.run.context import Flags, StepContext
from segue.run.worker import Heartbeat
from segue.states import Actor
from segue.store.base import Store


class _Seam:
    """The real store, with a gate on ``commit_checkpoint`` and failures to inject into
    ``report_progress``; everything else passes through."""

    def __init__(self, store: Store, *, failing_reports: int = 0) -> None:
        self._store = store
        self.commit_entered, self.commit_released = threading.Event(), threading.Event()
        self.failing_reports = failing_reports
        self.reports_failed = 0
        self.written: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def commit_checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        self.commit_entered.set()
        assert self.commit_released.wait(60), "the test never released the commit"
        return self._store.commit_checkpoint(*args, **kwargs)

    def report_progress(self, run_id: str, step: str, epoch: int, done: float, total: float | None) -> None:
        if self.reports_failed < self.failing_reports:
            self.reports_failed += 1
            raise sqlite3.OperationalError("database is locked (injected)")
        self._store.report_progress(run_id, step, epoch, done, total)
        self.written.append(done)


def _attempt(tmp_path: Path, failing_reports: int = 0) -> tuple[Store, _Seam, StepContext, Flags]:
    home = Home.resolve(tmp_path / "home")
    store = home.open_store()
    prepared = ops.prepare_run(str(FLOWS / "ondemand.py"), {"gate": str(tmp_path / "gate")}, run_id="p")
    ops.create_run(store, prepared)
    task = store.start_attempt("p", "loop", ttl_s=60, actor=Actor.CONTROLLER)
    seam = _Seam(store, failing_reports=failing_reports)
    flags = Flags()
    ctx = StepContext(run_id="p", spec=prepared.loaded.flow.steps["loop"], params=prepared.params,
                      epoch=task.epoch, attempt=task.attempts, store=seam,  # type: ignore[arg-type]
                      storage=home.storage(), flags=flags, load_input=lambda name: None,
                      code_fingerprint="x", home=home)
    return store, seam, ctx, flags


def _progress(store: Store) -> float | None:
    return store.get_task("p", "loop").progress_done


def _heartbeat(seam: _Seam, ctx: StepContext, flags: Flags) -> Heartbeat:
    hb = Heartbeat(seam, "p", "loop", ctx.epoch, 4.0, flags, parent_pid=os.getppid())  # type: ignore[arg-type]
    hb.start()
    return hb


def test_a_commit_that_lands_after_the_heartbeat_never_sets_progress_back(tmp_path: Path) -> None:
    store, seam, ctx, flags = _attempt(tmp_path)
    ctx.progress(99, 200)
    ctx.checkpoint({"i": 99}, position={"i": 99})  # saved in the background
    assert seam.commit_entered.wait(60), "the save never reached its commit"
    ctx.progress(100, 200)  # the step goes on while the commit waits
    hb = _heartbeat(seam, ctx, flags)
    try:
        wait_for(lambda: _progress(store) == 100, 30, "the heartbeat to write 100")
        seam.commit_released.set()
        ctx.close()  # the commit has landed
    finally:
        hb.stop_event.set()
        hb.join(10)
    [c] = store.list_checkpoints("p", "loop")
    assert c.position == {"i": 99}  # the checkpoint covers 99 items...
    assert _progress(store) == 100  # ...and the step's progress stays at what it reported last
    # 99 went with the commit's start (its event records the progress the store holds);
    # after the commit there was nothing newer to write
    assert seam.written == [99, 100]


def test_a_commit_writes_progress_the_heartbeat_has_not_written_yet(tmp_path: Path) -> None:
    store, seam, ctx, flags = _attempt(tmp_path)
    seam.commit_released.set()
    ctx.progress(7, 200)
    ctx.checkpoint({"i": 7}, position={"i": 7}, durable=True)  # no heartbeat runs
    assert _progress(store) == 7
    ctx.checkpoint({"i": 7}, position={"i": 7}, durable=True)
    assert seam.written == [7]  # unchanged progress is not written twice
    ctx.close()


def test_a_progress_report_whose_write_failed_is_written_by_the_next_heartbeat(tmp_path: Path) -> None:
    store, seam, ctx, flags = _attempt(tmp_path, failing_reports=2)
    ctx.progress(100, 200)  # the last report: the step waits after it
    hb = _heartbeat(seam, ctx, flags)
    try:
        wait_for(lambda: _progress(store) == 100, 30, "the report to be written despite two failed writes")
    finally:
        hb.stop_event.set()
        hb.join(10)
    assert seam.reports_failed == 2  # both injected failures landed
    assert seam.written == [100]
