"""Firing schedules: what `segue agent` (and `segue server`) do for them at every tick.

For each schedule that is not paused, at the store's clock (``Store.now()``: on
PostgreSQL the database's, the same for every host):

1. **Its last run started?** The run of its last slot, still PENDING with no live
   controller (the agent that fired it died before it started a controller), is
   claimed (``acquire_controller(expect_epoch=)``: of several agents one wins) and
   its controller started, as an agent starts a run it takes over.
2. **Which slots are due** (:func:`segue.scheduler.schedules.due_slots`): the slots
   after the last one, per the schedule's catch-up (none, latest, all).
3. **Each due slot, oldest first**, against the previous slot's run
   (:func:`~segue.scheduler.schedules.overlap_action`): *skip* records the slot as
   skipped (an event on the run still going) and moves on; *queue* leaves it due
   until that run finished; *cancel* cancels that run, then fires.
4. **Fire**: load and check the flow as `segue run` does, then ``Store.fire_slot``
   creates the slot's run under its deterministic id, fenced on the schedule's last
   slot (another agent that fired it first makes this a no-op), and the controller
   is started with a claim (step 1's way). A flow that no longer loads skips the
   slot and keeps the reason as the schedule's last error (`segue schedule ls`).

Nothing here holds state that matters: an agent killed at any point leaves the slot
unfired (another agent fires it), or fired and unstarted (step 1 starts it).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._faults import fault_point
from .._procs import pid_alive
from ..errors import (
    ControllerConflictError,
    IllegalTransitionError,
    RunStateError,
    SegueError,
    UnknownRunError,
    UsageError,
)
from ..flow import load_flow
from ..home import Home
from ..hostname import this_host
from ..scheduler import schedules as rules
from ..states import RunState
from ..store.base import NewRun, RunRecord, Store
from ..store.schedules_rows import NewSchedule, ScheduleRecord
from . import environment as run_env
from . import ops
from .options import RunOptions

log = logging.getLogger("segue.schedules")

# A fired run whose controller never took it is started at most this many times (each
# start is a claim and the controller's take-over: two controller epochs); a controller
# that cannot start at all must not be respawned every lease for ever.
MAX_STARTS = 3


@dataclass(frozen=True)
class Fired:
    """What a tick did with one slot."""

    schedule: str
    slot: float
    action: str  # "fire" | "skip" | "cancel" (then fired) | "error" (skipped: the flow did not load)
    run_id: str | None  # the slot's run, or for a skip the run still going


def _spawn(home: Home, pool: str | None, host: str) -> Callable[[RunRecord, int], None]:
    def start(run: RunRecord, claim: int) -> None:
        ops.spawn_detached(home, run.run_id, pool=pool, claim=(claim, run.controller_host), host=host)
    return start


class ScheduleFirer:
    """One agent's (or server's) view of the schedules; see the module docstring."""

    def __init__(self, home: Home, store: Store, *, host: str | None = None, pool: str | None = None,
                 actor: str | None = None, start: Callable[[RunRecord, int], None] | None = None,
                 grace_s: float = rules.GRACE_S) -> None:
        self.home = home
        self.store = store
        self.host = host or this_host()
        self.pool = pool
        self.actor = actor or f"agent:{self.host}"
        # How a claimed run's controller starts (default: a detached controller process).
        self.start = start or _spawn(home, pool, self.host)
        self.grace_s = grace_s
        self._pool: Any = None

    def tick(self) -> list[Fired]:
        """Fire every due slot of every schedule; one schedule's trouble (a store that
        refused, a flow that no longer loads) is logged and leaves the others be."""
        done: list[Fired] = []
        for s in self.store.list_schedules():
            try:
                if s.paused:  # fires nothing; a run it fired before the pause still gets started
                    self.start_if_orphaned(s.last_run)
                    continue
                done += self.fire_due(s)
            except SegueError as exc:
                log.warning("schedule %s: %s", s.name, exc)
            except Exception:  # noqa: BLE001 - an agent keeps its hosts' runs alive whatever a schedule does
                log.exception("schedule %s: firing failed", s.name)
        return done

    # -- one schedule ---------------------------------------------------------------------
    def fire_due(self, s: ScheduleRecord) -> list[Fired]:
        self.start_if_orphaned(s.last_run)
        now = self.store.now()
        after = s.last_slot if s.last_slot is not None else s.created_at
        done: list[Fired] = []
        for slot in rules.due_slots(s.cron, s.tz, catch_up=s.catch_up, after=after, now=now,
                                    grace_s=self.grace_s):
            previous = self._state(s.last_run)
            action = rules.overlap_action(s.overlap, previous)
            when = rules.fmt_slot(slot, s.tz)
            if action == rules.Action.WAIT:
                log.debug("schedule %s: slot %s waits for run %s (%s)", s.name, when, s.last_run, previous)
                break
            if action == rules.Action.SKIP:
                reason = (f"slot {when} of schedule {s.name!r} skipped: its previous run {s.last_run} "
                          f"is still {previous} (overlap: skip)")
                if not self.store.skip_slot(s.name, slot, actor=self._actor(s), reason=reason, run_id=s.last_run):
                    break  # another agent judged this slot first
                done.append(Fired(s.name, slot, "skip", s.last_run))
                continue
            if action == rules.Action.CANCEL and s.last_run is not None:
                self._cancel(s, s.last_run, when)
            fired = self._fire(s, slot)
            if fired is None:
                break  # fired by another agent (or the schedule was paused, or removed): re-read next tick
            done.append(fired)
            s = self.store.get_schedule(s.name)
        return done

    def _fire(self, s: ScheduleRecord, slot: float) -> Fired | None:
        run_id = rules.slot_run_id(s.name, slot)
        try:
            p = ops.prepare_run(s.flow_path, s.params, run_id=run_id, options=RunOptions.from_json(s.options),
                                pool=self._open_pool)
        except UsageError as exc:  # the flow file changed or went away, a parameter no longer fits
            error = f"slot {rules.fmt_slot(slot, s.tz)} not fired: {exc}"
            log.warning("schedule %s: %s", s.name, error)
            if not self.store.skip_slot(s.name, slot, actor=self._actor(s), reason=error, error=error):
                return None
            return Fired(s.name, slot, "error", None)
        env = run_env.capture(tuple(p.loaded.flow.env), p.loaded.path)  # as at a submit (run.environment)
        new = NewRun(run_id=p.run_id, flow_name=p.loaded.flow.name, flow_path=str(p.loaded.path),
                     params=p.params, fingerprint=p.loaded.fingerprint, options=p.options.to_json())
        run = self.store.fire_slot(s.name, slot, new, p.loaded.order, actor=self._actor(s))
        if run is None:
            return None
        # Tests kill the agent here: the slot's run exists, no controller was started
        # (another agent's step 1 starts it).
        fault_point("schedule.after_fire")
        run_env.record_submit(self.store, run.run_id, env, actor=self._actor(s))
        log.info("schedule %s: slot %s fired run %s", s.name, rules.fmt_slot(slot, s.tz), run.run_id)
        self._claim_and_start(run)
        return Fired(s.name, slot, "fire", run.run_id)

    def _cancel(self, s: ScheduleRecord, run_id: str, when: str) -> None:
        try:
            ops.cancel(self.store, run_id, actor=self._actor(s),
                       reason=f"cancelled by schedule {s.name!r}: slot {when} is due (overlap: cancel)")
        except (RunStateError, IllegalTransitionError, UnknownRunError):
            pass  # it finished (or was cancelled) meanwhile: nothing left to cancel

    # -- starting runs ----------------------------------------------------------------------
    def start_if_orphaned(self, run_id: str | None) -> bool:
        """Start the controller of a fired run that nothing drives yet (step 1)."""
        if run_id is None:
            return False
        try:
            run = self.store.get_run(run_id)
        except UnknownRunError:
            return False
        if run.state != RunState.PENDING or self._driven(run) or run.controller_epoch >= 2 * MAX_STARTS:
            return False
        log.info("run %s of a schedule was fired but not started: starting it", run_id)
        if run.controller_epoch == 0 and not self.store.list_events(run_id, kinds=("environment",)):
            self._record_environment(run)  # its firer died before it recorded it
        return self._claim_and_start(run)

    def _record_environment(self, run: RunRecord) -> None:
        try:
            loaded = load_flow(run.flow_path)
        except UsageError as exc:  # its controller will say so; the run starts without a record
            log.warning("run %s: environment not recorded: %s", run.run_id, exc)
            return
        env = run_env.capture(tuple(loaded.flow.env), loaded.path)
        run_env.record_submit(self.store, run.run_id, env, actor=self.actor)

    def _driven(self, run: RunRecord) -> bool:
        """Whether a live controller (or a live claim of another agent) holds the run."""
        local = run.controller_host == self.host
        ours = local and run.controller_pid == os.getpid()  # our own claim, its controller starting
        if run.controller_alive(self.store.now()):
            # A live lease; a controller of this host whose process is gone is dead now.
            return ours or not (local and not pid_alive(run.controller_pid))
        # A lapsed lease: a controller of this host whose process lives rides out a store outage.
        return local and not ours and pid_alive(run.controller_pid)

    def _claim_and_start(self, run: RunRecord) -> bool:
        ttl = RunOptions.from_json(run.options).lease_ttl_s
        try:
            claim = self.store.acquire_controller(run.run_id, pid=os.getpid(), host=self.host, ttl_s=ttl,
                                                  expect_epoch=run.controller_epoch)
        except (ControllerConflictError, UnknownRunError):
            return False  # another agent claimed it first
        self.start(run, claim)
        return True

    # -- plumbing ---------------------------------------------------------------------------
    def _state(self, run_id: str | None) -> RunState | None:
        if run_id is None:
            return None
        try:
            return self.store.get_run(run_id).state
        except UnknownRunError:
            return None

    def _actor(self, s: ScheduleRecord) -> str:
        return f"schedule:{s.name}"

    def _open_pool(self) -> Any:
        if self._pool is None:
            from ..store.hostpool import pool_path
            from ..store.pools import open_pool

            self._pool = open_pool(self.pool or pool_path(self.home.root, store=self.home.store), store=self.store)
        return self._pool


# -- the operator's side (`segue schedule`) --------------------------------------------------
def add_schedule(store: Store, name: str, flow: str, *, cron: str, tz: str = "UTC",
                 params: dict[str, Any] | None = None, options: RunOptions | None = None,
                 catch_up: str = "none", overlap: str = "skip", actor: str,
                 pool: Callable[[], Any] | None = None) -> ScheduleRecord:
    """Check everything as `segue run` would (the flow loads, its parameters fit, the
    run could be placed, its checkpoints' location is writable), then add the schedule.
    Bad input is one UsageError line and nothing is written."""
    rules.check_name(name)
    cron = rules.check_cron(cron)
    rules.check_tz(tz)
    rules.check_choice(catch_up, rules.CATCH_UP, "--catch-up")
    rules.check_choice(overlap, rules.OVERLAP, "--overlap")
    first = rules.next_slot(cron, tz, store.now())
    p = ops.prepare_run(flow, dict(params or {}), run_id=rules.slot_run_id(name, first), options=options,
                        pool=pool)
    return store.add_schedule(
        NewSchedule(name=name, flow_path=str(p.loaded.path), cron=cron, tz=tz, params=p.params,
                    options=p.options.to_json(), catch_up=catch_up, overlap=overlap), actor=actor)


def describe(store: Store, s: ScheduleRecord, at: float) -> dict[str, Any]:
    """One schedule as `segue schedule ls --json` shows it: its next slot (the first
    after ``at``, the store's time) and the run of its last slot with that run's state."""
    state = None
    if s.last_run is not None:
        try:
            state = store.get_run(s.last_run).state.value
        except UnknownRunError:
            state = "gone"
    return {"name": s.name, "flow": s.flow_path, "cron": s.cron, "tz": s.tz, "catch_up": s.catch_up,
            "overlap": s.overlap, "paused": s.paused, "params": s.params,
            "priority": s.options.get("priority"),
            "next_slot": rules.next_slot(s.cron, s.tz, at), "last_slot": s.last_slot,
            "last_run": s.last_run, "last_run_state": state, "last_error": s.last_error,
            "created_at": s.created_at, "created_by": s.created_by}
