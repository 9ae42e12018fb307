"""Hypothesis drives the run/task lifecycle against a real store of each backend.

A small model mirrors what the store should hold. Every command either
succeeds exactly as the transition tables allow, or raises and leaves the
store untouched. "crash" drops the store object and reopens it from its
target (file or database), as a new process would. Invariants are checked
after every step.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from _store_helpers import BACKENDS, make_run, open_target, snapshot
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from segue.errors import FencedError, IllegalTransitionError
from segue.states import RUN_TRANSITIONS, TASK_TRANSITIONS, Actor, RunState, TaskState
from segue.store import TaskRecord

R, T = RunState, TaskState
STEPS = ("a", "b")
steps = st.sampled_from(STEPS)


class Lifecycle(RuleBasedStateMachine):
    new_target: Callable[[], str]  # a fresh, empty store's target; set by the test

    def __init__(self) -> None:
        super().__init__()
        self.target = self.new_target()
        self.store = open_target(self.target)
        make_run(self.store, steps=STEPS)
        # The model: what the store must hold.
        self.run = R.PENDING
        self.state = {s: T.PENDING for s in STEPS}
        self.epoch = {s: 0 for s in STEPS}
        self.failures = {s: 0 for s in STEPS}
        self.next_seq = {s: 1 for s in STEPS}
        self.committed: set[tuple[str, int]] = set()
        # What the invariants have seen so far.
        self.seen_epoch = {s: 0 for s in STEPS}
        self.succeeded: dict[str, TaskRecord] = {}

    def teardown(self) -> None:
        self.store.close()

    # -- helpers -------------------------------------------------------------------
    def _illegal(self, call, exc: type[Exception] = IllegalTransitionError) -> None:
        before = snapshot(self.store)
        with pytest.raises(exc):
            call()
        assert snapshot(self.store) == before

    def _run_to(self, to: RunState, only_from: set[RunState] | None = None) -> bool:
        def call():
            return self.store.transition_run("r1", to, actor=Actor.CLI, reason="rule",
                                             only_from=only_from)

        if to == self.run:  # a no-op that writes nothing
            before = snapshot(self.store)
            assert call().state == to
            assert snapshot(self.store) == before
            return False
        if to in RUN_TRANSITIONS[self.run] and (only_from is None or self.run in only_from):
            assert call().state == to
            self.run = to
            return True
        self._illegal(call)
        return False

    def _task_to(self, step: str, to: TaskState, *, epoch: int | None = None,
                 actor: Actor = Actor.CONTROLLER, **kw) -> bool:
        def call():
            return self.store.transition_task("r1", step, to, actor=actor, reason="rule",
                                              epoch=epoch, **kw)

        only_from = kw.get("only_from")
        cur = self.state[step]
        if to in TASK_TRANSITIONS[cur] and (only_from is None or cur in only_from):
            rec = call()
            assert rec.state == to
            self.state[step] = to
            if kw.get("reset_failures"):
                self.failures[step] = 0
            if kw.get("count_failure"):
                self.failures[step] += 1
            return True
        self._illegal(call)
        return False

    # -- rules ---------------------------------------------------------------------
    # The terminal run states have their own rules with preconditions; drawn
    # here, they would end most examples after a few steps.
    @rule(to=st.sampled_from([r for r in RunState if not r.finished]))
    def run_to(self, to: RunState) -> None:
        self._run_to(to)

    @precondition(lambda self: all(s is T.SUCCEEDED for s in self.state.values()))
    @rule()
    def finish(self) -> None:
        self._run_to(R.SUCCEEDED)

    @rule()
    def request_pause(self) -> None:
        self._run_to(R.PAUSING)

    @rule()
    def park_all(self) -> None:
        for s in STEPS:
            if self.state[s] is T.RUNNING:  # the worker parks itself at a checkpoint
                self._task_to(s, T.PARKED, epoch=self.epoch[s], actor=Actor.WORKER)
            elif self.state[s] is T.RETRYING:
                self._task_to(s, T.PARKED)

    @rule()
    def pause_done(self) -> None:
        self._run_to(R.PAUSED, only_from={R.PAUSING})

    @rule()
    def resume(self) -> None:
        if self._run_to(R.RUNNING, only_from={R.PAUSED, R.FAILED}):
            for s in STEPS:
                if self.state[s] in (T.PARKED, T.FAILED):
                    self._task_to(s, T.PENDING, reset_failures=True, only_from={T.PARKED, T.FAILED})

    @precondition(lambda self: sum(self.epoch.values()) >= 3)
    @rule()
    def cancel(self) -> None:
        if self._run_to(R.CANCELLED):
            for s in STEPS:
                if not self.state[s].done or self.state[s] is T.FAILED:
                    self._task_to(s, T.CANCELLED, actor=Actor.CLI)

    @rule(step=steps)
    def start_attempt(self, step: str) -> None:
        def call():
            return self.store.start_attempt("r1", step, ttl_s=30, actor=Actor.CONTROLLER)

        if self.state[step] in (T.PENDING, T.RETRYING):
            rec = call()
            self.epoch[step] += 1
            self.state[step] = T.RUNNING
            assert (rec.state, rec.epoch) == (T.RUNNING, self.epoch[step])
        else:
            self._illegal(call)

    @rule(step=steps)
    def commit_checkpoint(self, step: str) -> None:
        seq = self.next_seq[step]
        rec = self.store.commit_checkpoint("r1", step, self.epoch[step], seq=seq,
                                           path=f"{step}/{seq}", position={"i": seq}, nbytes=seq)
        assert (rec.seq, rec.epoch, rec.status) == (seq, self.epoch[step], "committed")
        self.next_seq[step] += 1
        self.committed.add((step, seq))

    @precondition(lambda self: any(e > 0 for e in self.epoch.values()))
    @rule(step=steps)
    def commit_with_stale_epoch(self, step: str) -> None:
        if self.epoch[step] == 0:
            return
        self._illegal(
            lambda: self.store.commit_checkpoint(
                "r1", step, self.epoch[step] - 1, seq=self.next_seq[step], path="stale",
                position=None, nbytes=0),
            FencedError,
        )

    @rule(step=steps, exhausted=st.booleans())
    def attempt_fails(self, step: str, exhausted: bool) -> None:
        self._task_to(step, T.FAILED if exhausted else T.RETRYING, epoch=self.epoch[step],
                      actor=Actor.WORKER, count_failure=True, error="boom")

    @rule(step=steps)
    def lose_attempt(self, step: str) -> None:
        """The failure detector hands a RUNNING task back (its controller died)."""
        self._task_to(step, T.PENDING, actor=Actor.FAILURE_DETECTOR, only_from={T.RUNNING})

    # RUNNING is start_attempt's job; CANCELLED comes with the run's cancel.
    @rule(step=steps, to=st.sampled_from([t for t in TaskState
                                          if t not in (T.RUNNING, T.CANCELLED)]))
    def task_to(self, step: str, to: TaskState) -> None:
        self._task_to(step, to)

    @rule(step=steps)
    def complete(self, step: str) -> None:
        def call():
            return self.store.complete_task("r1", step, self.epoch[step], output_ref=f"out/{step}",
                                            actor=Actor.WORKER)

        if self.state[step] is T.RUNNING:
            assert call().output_ref == f"out/{step}"
            self.state[step] = T.SUCCEEDED
        else:
            self._illegal(call)

    @precondition(lambda self: bool(self.committed))
    @rule(data=st.data())
    def quarantine(self, data: st.DataObject) -> None:
        step, seq = data.draw(st.sampled_from(sorted(self.committed)))
        self.store.set_checkpoint_status("r1", step, seq, "quarantined", actor=Actor.WORKER,
                                         reason="checksum mismatch")
        self.committed.discard((step, seq))

    @rule()
    def crash(self) -> None:
        """Process death: the object goes away, a new process reopens the store."""
        self.store.close()
        self.store = open_target(self.target)

    # -- invariants ----------------------------------------------------------------
    @invariant()
    def stored_state_matches_the_model(self) -> None:
        run = self.store.get_run("r1")
        assert isinstance(run.state, RunState) and run.state == self.run
        for t in self.store.get_tasks("r1"):
            assert isinstance(t.state, TaskState)
            assert (t.state, t.epoch, t.failures) == (
                self.state[t.step], self.epoch[t.step], self.failures[t.step])
            if t.state is not T.RUNNING:
                assert t.lease_until is None and t.pid is None

    @invariant()
    def events_follow_the_tables(self) -> None:
        run_prev: RunState | None = None
        task_prev: dict[str, TaskState] = {s: T.PENDING for s in STEPS}
        for ev in self.store.list_events("r1"):
            if ev.kind == "run":
                if run_prev is None:
                    assert (ev.from_state, ev.to_state) == (None, "PENDING")
                else:
                    assert ev.from_state == run_prev
                    assert R(ev.to_state) in RUN_TRANSITIONS[run_prev]
                run_prev = R(ev.to_state)
            elif ev.kind == "task":
                assert ev.from_state == task_prev[ev.step]
                assert T(ev.to_state) in TASK_TRANSITIONS[task_prev[ev.step]]
                task_prev[ev.step] = T(ev.to_state)
        assert run_prev == self.run and task_prev == self.state

    @invariant()
    def committed_checkpoints_are_never_lost(self) -> None:
        stored = {(c.step, c.seq) for c in self.store.list_checkpoints("r1")}
        assert stored == self.committed

    @invariant()
    def epochs_never_decrease(self) -> None:
        for t in self.store.get_tasks("r1"):
            assert t.epoch >= self.seen_epoch[t.step]
            self.seen_epoch[t.step] = t.epoch

    @invariant()
    def succeeded_tasks_never_change(self) -> None:
        for t in self.store.get_tasks("r1"):
            if t.step in self.succeeded:
                assert t == self.succeeded[t.step]
            elif t.state is T.SUCCEEDED:
                self.succeeded[t.step] = t


SETTINGS = {
    "sqlite": settings(max_examples=60, stateful_step_count=50, deadline=None,
                       suppress_health_check=[HealthCheck.too_slow]),
    # Every example gets its own database; each step costs a few round trips.
    "postgres": settings(max_examples=20, stateful_step_count=50, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow]),
}


@pytest.mark.parametrize("backend", BACKENDS)
def test_lifecycle(backend: str, new_target: Callable[[str], str]) -> None:
    machine = type(f"Lifecycle_{backend}", (Lifecycle,),
                   {"new_target": staticmethod(lambda: new_target(backend))})
    run_state_machine_as_test(machine, settings=SETTINGS[backend])
