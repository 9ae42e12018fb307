"""The Store contract, run against every backend (see the ``store`` fixture)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from _store_helpers import BACKENDS, STEPS, make_run, new_run, refusals, snapshot

from segue.errors import (
    ControllerConflictError,
    FencedError,
    IllegalTransitionError,
    RunExistsError,
    StoreError,
    UnknownRunError,
)
from segue.states import Actor, RunState, TaskState
from segue.store import Heartbeat, Store

pytestmark = pytest.mark.parametrize("store", BACKENDS, indirect=True)

R, T = RunState, TaskState
STALE = r"^attempt epoch 1 of step 'train' in run 'r1' was superseded by epoch 2; this attempt must stop$"


def _two_attempts(store: Store) -> None:
    """Attempt 1 of 'train' is lost (its lease given back), attempt 2 now owns it."""
    make_run(store)
    store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER)
    store.transition_task("r1", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                          reason="lease expired")
    assert store.start_attempt("r1", "train", ttl_s=60, actor=Actor.CONTROLLER).epoch == 2


# -- runs -------------------------------------------------------------------------------
def test_create_run_inserts_pending_run_tasks_and_event(store: Store) -> None:
    before = time.time()
    rec = make_run(store)
    assert rec.run_id == "r1" and rec.state is R.PENDING
    assert (rec.flow_name, rec.flow_path) == ("demo", "/flows/demo.py")
    assert rec.params == new_run().params and rec.fingerprint == {"code": "abc123"}
    assert rec.options == {"retries": 2}
    assert rec.controller_epoch == 0 and rec.controller_lease_until is None
    assert not rec.controller_alive()
    assert before <= rec.created_at <= rec.updated_at <= time.time()
    tasks = store.get_tasks("r1")
    assert [t.step for t in tasks] == list(STEPS)
    assert all(t.state is T.PENDING and t.epoch == 0 and t.attempts == 0 for t in tasks)
    (ev,) = store.list_events("r1")
    assert (ev.kind, ev.from_state, ev.to_state, ev.actor) == ("run", None, "PENDING", "cli")
    assert store.get_run("r1") == rec


def test_tasks_keep_the_given_step_order(store: Store) -> None:
    make_run(store, steps=["zeta", "alpha", "mid"])
    assert [t.step for t in store.get_tasks("r1")] == ["zeta", "alpha", "mid"]


def test_create_run_twice_raises_and_changes_nothing(store: Store) -> None:
    make_run(store)
    before = snapshot(store)
    with pytest.raises(RunExistsError, match=r"^run 'r1' already exists; pick another --run-id"):
        store.create_run(new_run("r1"), ["other"], actor=Actor.CLI)
    assert snapshot(store) == before


def test_create_run_rejects_repeated_steps(store: Store) -> None:
    with pytest.raises(ValueError, match=r"^run 'r1': step names must be unique; repeated: \['a'\]$"):
        store.create_run(new_run(), ["a", "b", "a"], actor=Actor.CLI)
    assert store.list_runs() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_run("nope"),
        lambda s: s.get_tasks("nope"),
        lambda s: s.get_task("nope", "train"),
        lambda s: s.list_events("nope"),
        lambda s: s.list_checkpoints("nope"),
        lambda s: s.transition_run("nope", R.RUNNING, actor=Actor.CLI, reason="x"),
        lambda s: s.acquire_controller("nope", pid=1, host="h", ttl_s=5),
        lambda s: s.start_attempt("nope", "train", ttl_s=5, actor=Actor.CONTROLLER),
        lambda s: s.append_event("nope", "warning", actor=Actor.CLI, reason="x"),
    ],
)
def test_unknown_run_is_reported(store: Store, call) -> None:
    with pytest.raises(UnknownRunError, match=r"^unknown run 'nope'; `segue ls` lists the runs"):
        call(store)


def test_unknown_step_is_reported(store: Store) -> None:
    make_run(store)
    with pytest.raises(StoreError, match=r"^run 'r1' has no step 'nope'$"):
        store.get_task("r1", "nope")


def test_list_runs_newest_first(store: Store) -> None:
    for rid in ("a", "c", "b"):
        make_run(store, rid)
    assert [r.run_id for r in store.list_runs()] == ["b", "c", "a"]


def test_list_runs_filters_and_pages_and_counts(store: Store) -> None:
    for rid, flow in (("a", "demo"), ("b", "other"), ("c", "demo"), ("d", "demo")):
        store.create_run(replace(new_run(rid), flow_name=flow), STEPS, actor=Actor.CLI)
    store.transition_run("c", R.RUNNING, actor=Actor.CLI, reason="go")

    def ids(**kw) -> list[str]:
        return [r.run_id for r in store.list_runs(**kw)]

    assert ids(states={R.PENDING}) == ["d", "b", "a"]
    assert ids(states=[]) == []
    assert ids(flow="demo") == ["d", "c", "a"]
    assert ids(states={R.PENDING}, flow="demo") == ["d", "a"]
    assert ids(limit=2) == ["d", "c"] and ids(limit=2, offset=2) == ["b", "a"]
    assert ids(offset=3) == ["a"] and ids(limit=0) == []
    assert store.run_counts() == {(R.PENDING, "demo"): 2, (R.PENDING, "other"): 1,
                                  (R.RUNNING, "demo"): 1}


def test_events_by_kind(store: Store) -> None:
    make_run(store)
    store.append_event("r1", "note", actor=Actor.API, reason="n")
    store.transition_run("r1", R.RUNNING, actor=Actor.CLI, reason="go")
    assert [e.kind for e in store.list_events("r1", kinds=("run",))] == ["run", "run"]
    assert [e.reason for e in store.list_events("r1", kinds=["note", "nope"])] == ["n"]
    assert store.list_events("r1", kinds=()) == []


def test_transition_run_writes_state_and_event(store: Store) -> None:
    make_run(store)
    rec = store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="started")
    assert rec.state is R.RUNNING and store.get_run("r1").state is R.RUNNING
    ev = store.list_events("r1")[-1]
    assert (ev.kind, ev.from_state, ev.to_state) == ("run", "PENDING", "RUNNING")
    assert (ev.actor, ev.reason) == ("controller", "started")


@pytest.mark.parametrize(
    ("path", "to", "message"),
    [
        ([], R.SUCCEEDED, r"^a run cannot go from PENDING to SUCCEEDED$"),
        ([R.RUNNING], R.PENDING, r"^a run cannot go from RUNNING to PENDING$"),
        ([R.RUNNING, R.SUCCEEDED], R.RUNNING,
         r"^a run cannot go from SUCCEEDED to RUNNING; the run already succeeded; "
         r"start a new run instead$"),
        ([R.CANCELLED], R.PAUSING, r"^a run cannot go from CANCELLED to PAUSING; "
         r"the run already finished$"),
    ],
)
def test_illegal_run_transition_raises_and_changes_nothing(store, path, to, message) -> None:
    make_run(store)
    for s in path:
        store.transition_run("r1", s, actor=Actor.CLI, reason="setup")
    before = snapshot(store)
    with pytest.raises(IllegalTransitionError, match=message):
        store.transition_run("r1", to, actor=Actor.CLI, reason="bad")
    assert snapshot(store) == before


def test_transition_run_to_same_state_is_a_noop(store: Store) -> None:
    make_run(store)
    store.transition_run("r1", R.RUNNING, actor=Actor.CLI, reason="go")
    before = snapshot(store)
    rec = store.transition_run("r1", R.RUNNING, actor=Actor.CLI, reason="again")
    assert rec == before[0] and snapshot(store) == before


def test_transition_run_only_from_narrows_the_table(store: Store) -> None:
    make_run(store)
    store.transition_run("r1", R.RUNNING, actor=Actor.CLI, reason="go")
    before = snapshot(store)
    with pytest.raises(
        IllegalTransitionError,
        match=r"^a run cannot go from RUNNING to PAUSED; this change is only allowed from "
        r"PAUSING$",
    ):
        store.transition_run("r1", R.PAUSED, actor=Actor.CLI, reason="x", only_from={R.PAUSING})
    assert snapshot(store) == before
    rec = store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="x",
                               only_from=[R.RUNNING])
    assert rec.state is R.PAUSING


def test_events_are_appended_in_order_with_actor_and_reason(store: Store) -> None:
    make_run(store)
    store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="start")
    store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="user asked")
    store.transition_run("r1", R.PAUSED, actor=Actor.CONTROLLER, reason="all parked")
    ev = store.append_event("r1", "warning", actor=Actor.API, reason="disk low",
                            step="train", data={"free": 3})
    events = store.list_events("r1")
    assert [e.id for e in events] == sorted({e.id for e in events})
    assert [(e.to_state, e.actor, e.reason) for e in events[1:4]] == [
        ("RUNNING", "controller", "start"),
        ("PAUSING", "cli", "user asked"),
        ("PAUSED", "controller", "all parked"),
    ]
    assert events[-1] == ev
    assert (ev.kind, ev.step, ev.data) == ("warning", "train", {"free": 3})
    assert store.list_events("r1", after_id=events[1].id) == events[2:]
    assert store.list_events("r1", after_id=ev.id) == []


def test_events_of_other_runs_are_not_listed(store: Store) -> None:
    make_run(store, "r1")
    make_run(store, "r2")
    store.transition_run("r2", R.RUNNING, actor=Actor.CLI, reason="go")
    assert {e.run_id for e in store.list_events("r1")} == {"r1"}
    assert len(store.list_events("r2")) == 2


# -- controller lease --------------------------------------------------------------------------
def test_acquire_controller_sets_lease_and_event(store: Store) -> None:
    make_run(store)
    t0 = time.time()
    assert store.acquire_controller("r1", pid=111, host="h1", ttl_s=30) == 1
    rec = store.get_run("r1")
    assert (rec.controller_epoch, rec.controller_pid, rec.controller_host) == (1, 111, "h1")
    assert t0 + 30 <= rec.controller_lease_until <= time.time() + 30
    assert rec.controller_alive()
    ev = store.list_events("r1")[-1]
    assert ev.kind == "controller" and ev.data["epoch"] == 1


def test_second_live_controller_conflicts_unless_it_steals(store: Store) -> None:
    make_run(store)
    store.acquire_controller("r1", pid=111, host="h1", ttl_s=30)
    before = snapshot(store)
    with pytest.raises(
        ControllerConflictError,
        match=r"^run 'r1' is already driven by a live controller \(pid 111 on host h1, "
        r"lease until [^)]+\); wait for it, pause the run, or stop that process$",
    ):
        store.acquire_controller("r1", pid=222, host="h2", ttl_s=30)
    assert snapshot(store) == before
    assert store.acquire_controller("r1", pid=222, host="h2", ttl_s=30, steal=True) == 2
    rec = store.get_run("r1")
    assert (rec.controller_epoch, rec.controller_pid, rec.controller_host) == (2, 222, "h2")


@pytest.mark.parametrize("ttl", [0.0, -1.0])
def test_expired_controller_lease_can_be_taken(store: Store, ttl: float) -> None:
    make_run(store)
    store.acquire_controller("r1", pid=111, host="h1", ttl_s=ttl)
    assert not store.get_run("r1").controller_alive()
    assert store.acquire_controller("r1", pid=222, host="h2", ttl_s=30) == 2


def test_hand_over_takes_a_live_claim_only_at_its_epoch(store: Store) -> None:
    """A host agent claims a run (epoch 1) and starts a controller that takes the claim
    over with expect_epoch=1; a claim that somebody superseded is refused, writing nothing."""
    make_run(store)
    claim = store.acquire_controller("r1", pid=111, host="agent-b", ttl_s=30)
    assert store.acquire_controller("r1", pid=222, host="agent-b", ttl_s=30, expect_epoch=claim) == 2
    rec = store.get_run("r1")
    assert (rec.controller_epoch, rec.controller_pid) == (2, 222) and rec.controller_alive(store.now())
    before = snapshot(store)
    with pytest.raises(
        ControllerConflictError,
        match=r"^run 'r1' was claimed with controller epoch 1, but epoch 2 \(pid 222 on host agent-b\) "
        r"took it since; this controller stands down$",
    ):
        store.acquire_controller("r1", pid=333, host="agent-c", ttl_s=30, expect_epoch=claim)
    assert snapshot(store) == before


def test_store_now_is_the_clock_leases_are_stamped_with(store: Store) -> None:
    make_run(store)
    t0 = store.now()
    store.acquire_controller("r1", pid=111, host="h1", ttl_s=30)
    lease = store.get_run("r1").controller_lease_until
    assert t0 + 30 - 0.5 <= lease <= store.now() + 30 + 0.5


def test_renew_controller_extends_and_is_fenced(store: Store) -> None:
    make_run(store)
    e1 = store.acquire_controller("r1", pid=111, host="h1", ttl_s=1)
    rec = store.renew_controller("r1", e1, ttl_s=100)
    assert rec.controller_lease_until >= time.time() + 99
    assert store.get_run("r1") == rec
    e2 = store.acquire_controller("r1", pid=222, host="h2", ttl_s=30, steal=True)
    before = snapshot(store)
    with pytest.raises(
        FencedError,
        match=r"^controller epoch 1 of run 'r1' was superseded by epoch 2; "
        r"this controller must stop$",
    ):
        store.renew_controller("r1", e1, ttl_s=100)
    assert snapshot(store) == before
    assert [(e.actor, e.data) for e in refusals(store)] == [("controller", {"epoch": 1, "current": 2})]
    assert store.renew_controller("r1", e2, ttl_s=5).controller_epoch == 2


def test_release_controller_frees_the_run_and_ignores_stale_epochs(store: Store) -> None:
    make_run(store)
    e1 = store.acquire_controller("r1", pid=111, host="h1", ttl_s=30)
    store.release_controller("r1", e1)
    rec = store.get_run("r1")
    assert rec.controller_lease_until is None and rec.controller_pid is None
    assert rec.controller_epoch == 1
    store.release_controller("r1", e1)  # twice: no-op
    e2 = store.acquire_controller("r1", pid=222, host="h2", ttl_s=30)
    before = snapshot(store)
    store.release_controller("r1", e1)  # superseded: must not free e2's lease
    assert snapshot(store) == before
    assert store.get_run("r1").controller_epoch == e2


def test_transition_run_fenced_on_controller_epoch(store: Store) -> None:
    make_run(store)
    e1 = store.acquire_controller("r1", pid=111, host="h1", ttl_s=30)
    store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="go",
                         controller_epoch=e1)
    e2 = store.acquire_controller("r1", pid=222, host="h2", ttl_s=30, steal=True)
    before = snapshot(store)
    with pytest.raises(FencedError, match=r"^controller epoch 1 of run 'r1' was superseded"):
        store.transition_run("r1", R.SUCCEEDED, actor=Actor.CONTROLLER, reason="done",
                             controller_epoch=e1)
    assert snapshot(store) == before
    rec = store.transition_run("r1", R.SUCCEEDED, actor=Actor.CONTROLLER, reason="done",
                               controller_epoch=e2)
    assert rec.state is R.SUCCEEDED


# -- tasks ------------------------------------------------------------------------------------
def test_start_attempt_raises_epoch_and_sets_lease(store: Store) -> None:
    make_run(store)
    t0 = time.time()
    a1 = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    assert (a1.state, a1.epoch, a1.attempts) == (T.RUNNING, 1, 1)
    assert t0 + 20 <= a1.lease_until <= time.time() + 20
    assert a1.started_at is not None and a1.finished_at is None
    assert store.get_task("r1", "train") == a1
    store.transition_task("r1", "train", T.RETRYING, actor=Actor.WORKER, reason="oom",
                          epoch=1, count_failure=True, error="oom", next_attempt_at=t0 + 9)
    a2 = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    assert (a2.epoch, a2.attempts, a2.failures) == (2, 2, 1)
    assert a2.started_at == a1.started_at  # the first attempt's start
    assert a2.next_attempt_at is None
    ev = store.list_events("r1")[-1]
    assert (ev.kind, ev.step, ev.from_state, ev.to_state) == ("task", "train", "RETRYING",
                                                              "RUNNING")
    assert ev.data["epoch"] == 2


@pytest.mark.parametrize("state", [T.RUNNING, T.PARKED, T.SUCCEEDED, T.FAILED, T.CANCELLED])
def test_start_attempt_only_from_pending_or_retrying(store: Store, state: TaskState) -> None:
    make_run(store)
    if state is T.CANCELLED:
        store.transition_task("r1", "train", T.CANCELLED, actor=Actor.CLI, reason="x")
    else:
        rec = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
        if state is T.SUCCEEDED:
            store.complete_task("r1", "train", rec.epoch, output_ref="o", actor=Actor.WORKER)
        elif state is not T.RUNNING:
            store.transition_task("r1", "train", state, actor=Actor.WORKER, reason="x")
    before = snapshot(store)
    with pytest.raises(IllegalTransitionError,
                       match=rf"^a task cannot go from {state.value} to RUNNING$"):
        store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    assert snapshot(store) == before


def test_illegal_task_transition_raises_and_changes_nothing(store: Store) -> None:
    make_run(store)
    before = snapshot(store)
    with pytest.raises(IllegalTransitionError, match=r"^a task cannot go from PENDING to PARKED$"):
        store.transition_task("r1", "train", T.PARKED, actor=Actor.CLI, reason="x")
    with pytest.raises(
        IllegalTransitionError,
        match=r"^a task cannot go from PENDING to CANCELLED; this change is only allowed from "
        r"PARKED, RUNNING$",
    ):
        store.transition_task("r1", "train", T.CANCELLED, actor=Actor.CLI, reason="x",
                              only_from=[T.RUNNING, T.PARKED])
    assert snapshot(store) == before


def test_transition_task_to_running_must_go_through_start_attempt(store: Store) -> None:
    make_run(store)
    before = snapshot(store)
    with pytest.raises(ValueError, match=r"^step 'train' in run 'r1': use start_attempt to move "
                       r"a task to RUNNING; it raises the epoch that fences older attempts$"):
        store.transition_task("r1", "train", T.RUNNING, actor=Actor.CONTROLLER, reason="x")
    assert snapshot(store) == before


def test_leaving_running_clears_the_attempts_claim(store: Store) -> None:
    make_run(store)
    e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
    store.set_attempt_pid("r1", "train", e, 4242, "node-1")
    running = store.get_task("r1", "train")
    assert (running.pid, running.host) == (4242, "node-1")
    parked = store.transition_task("r1", "train", T.PARKED, actor=Actor.WORKER,
                                   reason="paused at checkpoint", epoch=e)
    assert (parked.pid, parked.host, parked.lease_until) == (None, None, None)
    assert parked.epoch == e and parked.state is T.PARKED
    ev = store.list_events("r1")[-1]
    assert (ev.from_state, ev.to_state, ev.actor, ev.reason) == (
        "RUNNING", "PARKED", "worker", "paused at checkpoint")


def test_failures_are_counted_and_reset(store: Store) -> None:
    make_run(store)
    for final in (T.RETRYING, T.FAILED):
        e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
        rec = store.transition_task("r1", "train", final, actor=Actor.WORKER, reason="boom",
                                    epoch=e, count_failure=True, error=f"boom {e}",
                                    next_attempt_at=123.0)
    assert (rec.state, rec.failures, rec.error) == (T.FAILED, 2, "boom 2")
    assert rec.finished_at is not None and rec.next_attempt_at is None
    assert store.list_events("r1")[-1].data == {"epoch": 2, "error": "boom 2"}
    rec = store.transition_task("r1", "train", T.PENDING, actor=Actor.CLI, reason="resume",
                                reset_failures=True)
    assert (rec.state, rec.failures, rec.finished_at) == (T.PENDING, 0, None)
    assert (rec.epoch, rec.attempts) == (2, 2)


def test_retrying_keeps_its_backoff_deadline(store: Store) -> None:
    make_run(store)
    e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
    rec = store.transition_task("r1", "train", T.RETRYING, actor=Actor.WORKER, reason="x",
                                epoch=e, count_failure=True, next_attempt_at=1234.5)
    assert (rec.next_attempt_at, rec.failures) == (1234.5, 1)


def test_heartbeat_extends_lease_and_reports_run_state(store: Store) -> None:
    make_run(store)
    store.transition_run("r1", R.RUNNING, actor=Actor.CONTROLLER, reason="go")
    e = store.start_attempt("r1", "train", ttl_s=1, actor=Actor.CONTROLLER).epoch
    hb = store.heartbeat("r1", "train", e, ttl_s=50)
    assert hb == Heartbeat(run_state=R.RUNNING, lease_until=hb.lease_until)
    assert hb.lease_until >= time.time() + 49
    assert store.get_task("r1", "train").lease_until == hb.lease_until
    store.transition_run("r1", R.PAUSING, actor=Actor.CLI, reason="pause")
    assert store.heartbeat("r1", "train", e, ttl_s=50).run_state is R.PAUSING


def test_heartbeat_of_an_attempt_that_lost_its_task_is_fenced(store: Store) -> None:
    make_run(store)
    e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
    store.transition_task("r1", "train", T.PENDING, actor=Actor.FAILURE_DETECTOR,
                          reason="lease expired")
    before = snapshot(store)
    with pytest.raises(FencedError, match=r"^attempt epoch 1 of step 'train' in run 'r1' no "
                       r"longer holds the task \(now PENDING\); this attempt must stop$"):
        store.heartbeat("r1", "train", e, ttl_s=20)
    assert snapshot(store) == before


def test_report_progress(store: Store) -> None:
    make_run(store)
    e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
    store.report_progress("r1", "train", e, 30.0, 100.0)
    rec = store.get_task("r1", "train")
    assert (rec.progress_done, rec.progress_total) == (30.0, 100.0)
    store.report_progress("r1", "train", e, 31.0, None)
    assert store.get_task("r1", "train").progress_total is None


FENCED_CALLS = {
    "set_attempt_pid": lambda s: s.set_attempt_pid("r1", "train", 1, 9, "h"),
    "heartbeat": lambda s: s.heartbeat("r1", "train", 1, ttl_s=99),
    "report_progress": lambda s: s.report_progress("r1", "train", 1, 5.0, 10.0),
    "commit_checkpoint": lambda s: s.commit_checkpoint(
        "r1", "train", 1, seq=99, path="ckpt/99", position={"i": 1}, nbytes=1),
    "complete_task": lambda s: s.complete_task("r1", "train", 1, output_ref="o",
                                               actor=Actor.WORKER),
    "transition_task": lambda s: s.transition_task(
        "r1", "train", T.PARKED, actor=Actor.WORKER, reason="x", epoch=1),
}


@pytest.mark.parametrize("call", FENCED_CALLS.values(), ids=FENCED_CALLS.keys())
def test_fenced_methods_refuse_a_superseded_epoch(store: Store, call) -> None:
    _two_attempts(store)
    before = snapshot(store)
    with pytest.raises(FencedError, match=STALE):
        call(store)
    assert snapshot(store) == before
    # ...but the refusal itself is on record, naming the stale and the current epoch.
    (ev,) = refusals(store)
    assert (ev.step, ev.actor, ev.data) == ("train", "worker", {"epoch": 1, "current": 2})
    assert ev.reason == "write refused: " + STALE[1:-1]


# -- checkpoints ----------------------------------------------------------------------------
def _commit(store: Store, seq: int, step: str = "train", epoch: int = 1):
    return store.commit_checkpoint("r1", step, epoch, seq=seq, path=f"{step}/{seq:06d}",
                                   position={"step": seq * 100}, nbytes=seq * 10)


def test_commit_checkpoint_records_and_lists_newest_first(store: Store) -> None:
    make_run(store)
    store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    t0 = time.time()
    c1 = _commit(store, 1)
    assert (c1.run_id, c1.step, c1.seq, c1.epoch, c1.path) == ("r1", "train", 1, 1, "train/000001")
    assert (c1.position, c1.nbytes, c1.status) == ({"step": 100}, 10, "committed")
    assert t0 <= c1.created_at <= time.time()
    ev = store.list_events("r1")[-1]
    assert (ev.kind, ev.step) == ("checkpoint", "train")
    assert ev.data == {"seq": 1, "epoch": 1, "path": "train/000001",
                       "position": {"step": 100}, "nbytes": 10}
    _commit(store, 2)
    _commit(store, 5)
    assert [c.seq for c in store.list_checkpoints("r1", "train")] == [5, 2, 1]
    assert store.list_checkpoints("r1", "train")[-1] == c1


@pytest.mark.parametrize("seq", [3, 2, 0, -1])
def test_commit_checkpoint_requires_a_larger_seq(store: Store, seq: int) -> None:
    make_run(store)
    store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    _commit(store, 1)
    _commit(store, 3)
    store.set_checkpoint_status("r1", "train", 3, "pruned", actor=Actor.CONTROLLER,
                                reason="retention")
    before = snapshot(store)
    with pytest.raises(StoreError, match=rf"^checkpoint seq {seq} of step 'train' in run 'r1' "
                       r"does not exceed the newest recorded seq 3; each checkpoint needs a "
                       r"larger seq$"):
        _commit(store, seq)
    assert snapshot(store) == before


def test_checkpoint_statuses(store: Store) -> None:
    make_run(store)
    store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER)
    for seq in (1, 2, 3):
        _commit(store, seq)
    store.set_checkpoint_status("r1", "train", 3, "quarantined", actor=Actor.WORKER,
                                reason="checksum mismatch")
    store.set_checkpoint_status("r1", "train", 1, "pruned", actor=Actor.CONTROLLER,
                                reason="retention")
    ev = store.list_events("r1")[-2]
    assert (ev.kind, ev.from_state, ev.to_state, ev.reason, ev.data) == (
        "checkpoint", "committed", "quarantined", "checksum mismatch", {"seq": 3})

    def seqs(**kw):
        return [c.seq for c in store.list_checkpoints("r1", "train", **kw)]

    assert seqs() == [2]
    assert seqs(statuses=("quarantined",)) == [3]
    assert seqs(statuses={"committed", "quarantined", "pruned"}) == [3, 2, 1]
    assert seqs(statuses=()) == []
    with pytest.raises(StoreError, match=r"^run 'r1' has no checkpoint 7 of step 'train'$"):
        store.set_checkpoint_status("r1", "train", 7, "pruned", actor=Actor.CLI, reason="x")
    with pytest.raises(ValueError, match=r"^checkpoint status must be one of"):
        store.set_checkpoint_status("r1", "train", 2, "gone", actor=Actor.CLI, reason="x")


def test_list_checkpoints_of_a_run_groups_steps_newest_first(store: Store) -> None:
    make_run(store)
    for step in ("eval", "load"):
        store.start_attempt("r1", step, ttl_s=20, actor=Actor.CONTROLLER)
    for seq in (1, 2):
        _commit(store, seq, step="eval")
        _commit(store, seq, step="load")
    got = [(c.step, c.seq) for c in store.list_checkpoints("r1")]
    assert got == [("load", 2), ("load", 1), ("eval", 2), ("eval", 1)]


def test_complete_task(store: Store) -> None:
    make_run(store)
    e = store.start_attempt("r1", "train", ttl_s=20, actor=Actor.CONTROLLER).epoch
    rec = store.complete_task("r1", "train", e, output_ref="out/train.parquet",
                              actor=Actor.WORKER)
    assert (rec.state, rec.output_ref, rec.lease_until) == (T.SUCCEEDED, "out/train.parquet",
                                                            None)
    assert rec.finished_at is not None and store.get_task("r1", "train") == rec
    ev = store.list_events("r1")[-1]
    assert (ev.from_state, ev.to_state, ev.actor) == ("RUNNING", "SUCCEEDED", "worker")
    before = snapshot(store)
    with pytest.raises(IllegalTransitionError,
                       match=r"^a task cannot go from SUCCEEDED to SUCCEEDED$"):
        store.complete_task("r1", "train", e, output_ref="other", actor=Actor.WORKER)
    with pytest.raises(IllegalTransitionError,
                       match=r"^a task cannot go from SUCCEEDED to PENDING$"):
        store.transition_task("r1", "train", T.PENDING, actor=Actor.CLI, reason="x")
    assert snapshot(store) == before


def test_complete_task_requires_running(store: Store) -> None:
    make_run(store)
    before = snapshot(store)
    with pytest.raises(IllegalTransitionError,
                       match=r"^a task cannot go from PENDING to SUCCEEDED$"):
        store.complete_task("r1", "train", 0, output_ref="o", actor=Actor.WORKER)
    assert snapshot(store) == before


def test_append_event_to_unknown_step(store: Store) -> None:
    make_run(store)
    with pytest.raises(StoreError, match=r"^run 'r1' has no step 'nope'$"):
        store.append_event("r1", "warning", actor=Actor.CLI, reason="x", step="nope")


# -- hosts (segue agent) -------------------------------------------------------------------------
def test_host_registry_leases_epochs_and_fencing(store: Store) -> None:
    assert store.list_hosts() == []
    e1 = store.register_host("a", pid=10, info={"gpus": 2}, ttl_s=30)
    assert e1 == 1
    [h] = store.list_hosts()
    assert (h.host, h.epoch, h.pid, h.info) == ("a", 1, 10, {"gpus": 2}) and h.alive(store.now())
    before = store.list_hosts()
    with pytest.raises(ControllerConflictError,
                       match=r"^host 'a' already has a live agent \(pid 10, lease until [^)]+\); stop it "
                             r"first, or give this one another --host-id$"):
        store.register_host("a", pid=11, info={}, ttl_s=30)
    assert store.list_hosts() == before
    assert store.register_host("a", pid=11, info={}, ttl_s=30, steal=True) == 2  # pid 10 proved dead
    e1 = 2
    renewed = store.renew_host("a", e1, ttl_s=60, info={"gpus": 1})
    assert renewed.info == {"gpus": 1} and renewed.lease_until >= h.lease_until
    store.register_host("b", pid=20, info={}, ttl_s=30)
    assert [x.host for x in store.list_hosts()] == ["a", "b"]
    store.release_host("a", e1)
    assert not store.list_hosts()[0].alive(store.now())
    e2 = store.register_host("a", pid=12, info={}, ttl_s=30)  # a new agent for host a
    assert e2 == 3
    with pytest.raises(FencedError, match=r"^agent epoch 2 of host 'a' was superseded by epoch 3; "
                                          r"this agent must stop$"):
        store.renew_host("a", e1, ttl_s=30)
    store.release_host("a", e1)  # superseded: must not end e2's lease
    assert store.list_hosts()[0].alive(store.now())


@pytest.mark.parametrize("ttl", [0.0, -1.0])
def test_a_host_whose_agent_lease_expired_can_be_registered_again(store: Store, ttl: float) -> None:
    store.register_host("a", pid=10, info={}, ttl_s=ttl)
    assert not store.list_hosts()[0].alive(store.now())
    assert store.register_host("a", pid=11, info={}, ttl_s=30) == 2
