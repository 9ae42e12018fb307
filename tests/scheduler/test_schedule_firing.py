"""The firing loop (segue.run.schedules.ScheduleFirer) on a real SQLite store with a
virtual clock: catch-up, the overlap policies (skip, queue, cancel), a flow that no
longer loads, a paused schedule. Its one seam is how a claimed run's controller
starts: here the "controller" takes the claim over and moves the run to RUNNING, and
the test decides when the run ends."""

from __future__ import annotations

from pathlib import Path

import pytest
from segue_helpers import VirtualClock

from segue.errors import UsageError
from segue.home import Home
from segue.run.schedules import ScheduleFirer, add_schedule, describe
from segue.scheduler.schedules import next_slot, slot_run_id
from segue.states import Actor, RunState
from segue.store import SQLiteStore
from segue.store.base import RunRecord

FLOW = '''from segue import Flow

flow = Flow("nightly", params={"day": "today"})


@flow.step()
def only(ctx):
    return ctx.params["day"]
'''


class World:
    def __init__(self, tmp: Path) -> None:
        self.clock = VirtualClock(start=1_800_000_000.0)
        self.home = Home.resolve(tmp / "home")
        self.home.ensure()
        self.store = SQLiteStore(self.home.db_path, clock=self.clock)
        self.flow = tmp / "nightly.py"
        self.flow.write_text(FLOW)
        self.started: list[tuple[str, int]] = []
        self.firer = ScheduleFirer(self.home, self.store, host="h1", start=self._start)
        self.epochs: dict[str, int] = {}

    def _start(self, run: RunRecord, claim: int) -> None:
        self.started.append((run.run_id, claim))
        epoch = self.store.acquire_controller(run.run_id, pid=1, host="h1", ttl_s=10, expect_epoch=claim)
        self.epochs[run.run_id] = epoch
        self.store.transition_run(run.run_id, RunState.RUNNING, actor=Actor.CONTROLLER, reason="test",
                                  controller_epoch=epoch)

    def finish(self, run_id: str, state: RunState = RunState.SUCCEEDED) -> None:
        self.store.transition_run(run_id, state, actor=Actor.CONTROLLER, reason="test",
                                  controller_epoch=self.epochs[run_id])

    def add(self, cron: str = "0 2 * * *", **kw: str) -> float:
        s = add_schedule(self.store, "nightly", str(self.flow), cron=cron, params={"day": "x"}, actor="test", **kw)
        return next_slot(s.cron, s.tz, s.created_at)

    def at(self, t: float) -> list[tuple[str, str | None]]:
        self.clock.advance(t - self.clock())
        return [(f.action, f.run_id) for f in self.firer.tick()]


@pytest.fixture
def w(tmp_path: Path) -> World:
    return World(tmp_path)


def test_a_due_slot_fires_one_run_started_once_and_not_again(w: World) -> None:
    first = w.add()
    assert w.at(first - 1) == []
    rid = slot_run_id("nightly", first)
    assert w.at(first + 1) == [("fire", rid)]
    assert w.started == [(rid, 1)]
    run = w.store.get_run(rid)
    assert run.params == {"day": "x"} and run.flow_path == str(w.flow.resolve())
    assert w.at(first + 30) == []  # the same slot is not fired twice
    assert w.started == [(rid, 1)]
    s = w.store.get_schedule("nightly")
    assert (s.last_slot, s.last_run) == (first, rid)
    assert describe(w.store, s, w.clock())["last_run_state"] == "RUNNING"


def test_overlap_skip_records_the_slot_on_the_run_still_going(w: World) -> None:
    first = w.add(overlap="skip")
    r1 = slot_run_id("nightly", first)
    w.at(first + 1)
    second = first + 86400
    assert w.at(second + 1) == [("skip", r1)]
    ev = w.store.list_events(r1, kinds=("schedule",))
    assert len(ev) == 1 and "skipped" in ev[0].reason and "still RUNNING" in ev[0].reason
    assert w.store.get_schedule("nightly").last_slot == second
    w.finish(r1)
    assert w.at(second + 60) == []  # the skipped slot stays skipped
    third = second + 86400
    assert w.at(third + 1) == [("fire", slot_run_id("nightly", third))]


def test_overlap_queue_waits_for_the_previous_run_then_fires(w: World) -> None:
    first = w.add(overlap="queue", catch_up="all")
    r1 = slot_run_id("nightly", first)
    w.at(first + 1)
    days = [first + 86400 * i for i in (1, 2)]
    assert w.at(days[1] + 1) == []  # two slots due, both wait behind run 1
    assert w.store.get_schedule("nightly").last_slot == first
    w.finish(r1, RunState.FAILED)  # a failed run has finished too
    assert w.at(days[1] + 2) == [("fire", slot_run_id("nightly", days[0]))]  # oldest first, one at a time
    w.finish(slot_run_id("nightly", days[0]))
    assert w.at(days[1] + 3) == [("fire", slot_run_id("nightly", days[1]))]


def test_overlap_cancel_cancels_the_previous_run_then_fires(w: World) -> None:
    first = w.add(overlap="cancel")
    r1 = slot_run_id("nightly", first)
    w.at(first + 1)
    second = first + 86400
    assert w.at(second + 1) == [("fire", slot_run_id("nightly", second))]
    assert w.store.get_run(r1).state == RunState.CANCELLED
    why = [e for e in w.store.list_events(r1) if e.to_state == "CANCELLED"]
    assert why[0].actor == "schedule:nightly" and "overlap: cancel" in why[0].reason


def test_catch_up_latest_after_an_outage_fires_only_the_newest_slot(w: World) -> None:
    first = w.add(catch_up="latest")
    w.at(first + 1)
    w.finish(slot_run_id("nightly", first))
    later = first + 5 * 86400
    assert w.at(later + 3 * 3600) == [("fire", slot_run_id("nightly", later))]


def test_catch_up_none_after_an_outage_fires_nothing_until_the_next_slot(w: World) -> None:
    first = w.add()
    w.at(first + 1)
    w.finish(slot_run_id("nightly", first))
    assert w.at(first + 5 * 86400 + 3 * 3600) == []
    nxt = first + 6 * 86400
    assert w.at(nxt + 2) == [("fire", slot_run_id("nightly", nxt))]


def test_a_paused_schedule_fires_nothing(w: World) -> None:
    first = w.add(catch_up="latest")
    w.store.set_schedule_paused("nightly", True, actor="test")
    assert w.at(first + 1) == []
    w.store.set_schedule_paused("nightly", False, actor="test")
    assert w.at(first + 2) == [("fire", slot_run_id("nightly", first))]


def test_a_flow_that_no_longer_loads_skips_the_slot_with_its_reason(w: World) -> None:
    first = w.add()
    w.flow.write_text("this is not python(")
    assert w.at(first + 1) == [("error", None)]
    s = w.store.get_schedule("nightly")
    assert s.last_slot == first and "not fired" in (s.last_error or "") and "syntax" in s.last_error
    assert w.store.list_runs() == []
    w.flow.write_text(FLOW)  # fixed: the next slot fires, and the error is gone
    nxt = first + 86400
    assert w.at(nxt + 1) == [("fire", slot_run_id("nightly", nxt))]
    assert w.store.get_schedule("nightly").last_error is None


def test_a_fired_run_nothing_started_is_started_at_the_next_tick(w: World) -> None:
    first = w.add()
    rid = slot_run_id("nightly", first)
    fail = [True]

    def start(run: RunRecord, claim: int) -> None:  # the first controller never takes the run
        if fail.pop() if fail else False:
            return
        w._start(run, claim)

    w.firer.start = start
    w.at(first + 1)
    assert w.store.get_run(rid).state == RunState.PENDING
    assert w.at(first + 5) == []  # our claim's lease still lives: the controller may be starting
    w.at(first + 30)  # the claim lapsed, nothing took it: claimed again and started
    assert w.started == [(rid, 2)] and w.store.get_run(rid).state == RunState.RUNNING


def test_add_checks_everything_first_and_writes_nothing_on_bad_input(w: World) -> None:
    cases = [({"cron": "0 2 * *"}, "5 fields"), ({"cron": "0 2 * * 9"}, "day-of-week field '9'"),
             ({"tz": "Nowhere/Land"}, "unknown time zone"), ({"catch_up": "some"}, "--catch-up must be one of"),
             ({"overlap": "both"}, "--overlap must be one of"), ({"params": {"nope": 1}}, "unknown parameter 'nope'"),
             ({"flow": "/nope.py"}, "does not exist")]
    for kw, message in cases:
        args = {"cron": "0 2 * * *", "params": {}, "flow": str(w.flow), **kw}
        with pytest.raises(UsageError, match=message):
            add_schedule(w.store, "nightly", args.pop("flow"), actor="test", **args)
    with pytest.raises(UsageError, match="schedule name"):
        add_schedule(w.store, "bad/name", str(w.flow), cron="0 2 * * *", actor="test")
    assert w.store.list_schedules() == []
