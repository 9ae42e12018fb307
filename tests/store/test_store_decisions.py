"""record_decision: a run's path decided in one transaction, fenced, recorded once (every backend)."""

from __future__ import annotations

import pytest
from _store_helpers import BACKENDS, STEPS, make_run

from segue.errors import FencedError, IllegalTransitionError
from segue.states import Actor, TaskState
from segue.store import Store

pytestmark = pytest.mark.parametrize("store", BACKENDS, indirect=True)
T = TaskState


def _controller(store: Store) -> int:
    make_run(store)
    return store.acquire_controller("r1", pid=1, host="h", ttl_s=60)


def test_a_decision_adds_tasks_skips_others_and_records_one_event(store: Store) -> None:
    epoch = _controller(store)
    added = tuple(f"fan.{i}" for i in range(1000))
    skip = STEPS[-1]
    assert store.record_decision("r1", STEPS[0], controller_epoch=epoch, actor=Actor.CONTROLLER,
                                 reason="fans out", add=added, skip=(skip,), data={"kind": "foreach"})
    tasks = store.get_tasks("r1")
    assert [t.step for t in tasks] == [*STEPS, *added]  # after the others, in the order given
    assert all(t.state is T.PENDING for t in tasks if t.step != skip)
    assert store.get_task("r1", skip).state is T.SKIPPED
    ev = [e for e in store.list_events("r1") if e.kind == "decision"]
    assert len(ev) == 1 and ev[0].step == STEPS[0]
    assert ev[0].data["kind"] == "foreach" and ev[0].data["added"] == 1000
    assert ev[0].data["skipped"] == [skip] and "tasks" not in ev[0].data  # 1000 names are not copied
    skipped = [e for e in store.list_events("r1", kinds=("task",)) if e.to_state == "SKIPPED"]
    assert [e.step for e in skipped] == [skip]
    # Recorded once: the same decision again writes nothing (a controller that took over).
    assert not store.record_decision("r1", STEPS[0], controller_epoch=epoch, actor=Actor.CONTROLLER,
                                     reason="again", add=added, data={"kind": "foreach"})
    assert len([e for e in store.list_events("r1") if e.kind == "decision"]) == 1


def test_a_stale_controller_cannot_decide(store: Store) -> None:
    old = _controller(store)
    store.release_controller("r1", old)
    new = store.acquire_controller("r1", pid=2, host="h", ttl_s=60)
    assert new > old
    with pytest.raises(FencedError):
        store.record_decision("r1", STEPS[0], controller_epoch=old, actor=Actor.CONTROLLER, reason="zombie",
                              add=("fan.0",), skip=(STEPS[1],))
    assert [t.step for t in store.get_tasks("r1")] == list(STEPS)
    assert store.get_task("r1", STEPS[1]).state is T.PENDING
    assert not [e for e in store.list_events("r1") if e.kind == "decision"]


def test_only_a_pending_task_is_skipped_and_only_a_restart_brings_it_back(store: Store) -> None:
    epoch = _controller(store)
    store.start_attempt("r1", STEPS[1], ttl_s=60, actor=Actor.CONTROLLER)
    store.record_decision("r1", STEPS[0], controller_epoch=epoch, actor=Actor.CONTROLLER, reason="branch",
                          skip=(STEPS[1], STEPS[2]))
    assert store.get_task("r1", STEPS[1]).state is T.RUNNING  # already started: left as it is
    assert store.get_task("r1", STEPS[2]).state is T.SKIPPED
    with pytest.raises(IllegalTransitionError):
        store.start_attempt("r1", STEPS[2], ttl_s=60, actor=Actor.CONTROLLER)
    with pytest.raises(IllegalTransitionError):  # no transition leaves SKIPPED...
        store.transition_task("r1", STEPS[2], T.PENDING, actor=Actor.CLI, reason="back")
    store.restart_path("r1", STEPS[0], reset=(STEPS[2],), drop=(), actor=Actor.CLI, reason="--restart-step")
    assert store.get_task("r1", STEPS[2]).state is T.PENDING  # ...but the operator's restart of its path


def test_restart_path_drops_items_resets_steps_and_keeps_epochs_rising(store: Store) -> None:
    epoch = _controller(store)
    store.record_decision("r1", "load", controller_epoch=epoch, actor=Actor.CONTROLLER, reason="fan-out",
                          add=("train.0", "train.1"))
    for name in ("load", "train.0", "train.1"):
        rec = store.start_attempt("r1", name, ttl_s=60, actor=Actor.CONTROLLER)
        if name == "train.1":
            store.commit_checkpoint("r1", name, rec.epoch, seq=1, path="p", position={}, nbytes=1)
        store.complete_task("r1", name, rec.epoch, output_ref=f"out-{name}", actor=Actor.WORKER)
    store.record_decision("r1", "train", controller_epoch=epoch, actor=Actor.CONTROLLER, reason="branch",
                          skip=("eval",))
    store.restart_path("r1", "load", reset=("load", "train", "eval"), drop=("train.0", "train.1"),
                       actor=Actor.CLI, reason="--restart-step load")
    tasks = {t.step: t for t in store.get_tasks("r1")}
    assert set(tasks) == {"load", "train", "eval"}  # the items are gone
    assert all(t.state is T.PENDING for t in tasks.values())
    assert tasks["load"].epoch == 1  # epochs never go back
    assert not [c for c in store.list_checkpoints("r1") if c.step == "train.1"]  # gone with the item
    ev = [e for e in store.list_events("r1") if e.kind == "restart-path"]
    assert len(ev) == 1 and ev[0].data["floors"] == {"train": 1} and ev[0].data["dropped"] == 2
    floors = {e.step: e.data["discarded_through_seq"] for e in store.list_events("r1", kinds=("restart-step",))}
    assert floors == {"load": 0, "train": 0, "eval": 0}
    # The fan-out decided again: its new items start above the dropped ones' epochs.
    assert store.record_decision("r1", "train", controller_epoch=epoch, actor=Actor.CONTROLLER, reason="again",
                                 add=("train.0",), epoch=1)
    assert store.start_attempt("r1", "train.0", ttl_s=60, actor=Actor.CONTROLLER).epoch == 2
