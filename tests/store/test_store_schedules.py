"""Schedules in the store, on both backends: the records, the refusals, and the fence
of a slot (``fire_slot``, ``skip_slot``); then the firing loop in several processes
racing on one store over a hundred slots of a virtual clock, one of them SIGKILLed at
a slot boundary, and one killed between firing a slot and starting its run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from _store_helpers import BACKENDS, new_run, open_target
from segue_helpers import VirtualClock, wait_for

from segue.errors import NotFoundError, UsageError
from segue.states import RunState
from segue.store import Store
from segue.store.schedules_rows import NewSchedule

HERE = Path(__file__).parent
SPEC = NewSchedule(name="nightly", flow_path="/flows/demo.py", cron="0 2 * * *", tz="Europe/Berlin",
                   params={"n": 3}, options={"priority": 10}, catch_up="all", overlap="queue")


@pytest.mark.parametrize("store", BACKENDS, indirect=True)
class TestContract:
    def test_add_get_list_pause_remove(self, store: Store) -> None:
        t0 = store.now()
        s = store.add_schedule(SPEC, actor="cli")
        assert (s.name, s.flow_path, s.cron, s.tz, s.params, s.options, s.catch_up, s.overlap) == (
            "nightly", "/flows/demo.py", "0 2 * * *", "Europe/Berlin", {"n": 3}, {"priority": 10}, "all", "queue")
        assert not s.paused and s.last_slot is None and s.last_run is None and s.created_by == "cli"
        assert t0 - 1 <= s.created_at <= store.now() + 1
        store.add_schedule(NewSchedule(name="a-first", flow_path="/f.py", cron="* * * * *"), actor="cli")
        assert [x.name for x in store.list_schedules()] == ["a-first", "nightly"]
        assert store.set_schedule_paused("nightly", True, actor="cli").paused
        assert store.get_schedule("nightly").paused
        assert not store.set_schedule_paused("nightly", False, actor="cli").paused
        store.remove_schedule("nightly", actor="cli")
        assert [x.name for x in store.list_schedules()] == ["a-first"]

    def test_refusals_are_one_line_and_write_nothing(self, store: Store) -> None:
        store.add_schedule(SPEC, actor="cli")
        with pytest.raises(UsageError, match="^schedule 'nightly' already exists"):
            store.add_schedule(SPEC, actor="cli")
        for call in (lambda: store.get_schedule("nope"), lambda: store.remove_schedule("nope", actor="cli"),
                     lambda: store.set_schedule_paused("nope", True, actor="cli"),
                     lambda: store.fire_slot("nope", 60.0, new_run("x"), ["a"], actor="t"),
                     lambda: store.skip_slot("nope", 60.0, actor="t", reason="r")):
            with pytest.raises(NotFoundError, match="^unknown schedule 'nope'"):
                call()
        assert [s.name for s in store.list_schedules()] == ["nightly"]
        assert store.list_runs() == []

    def test_a_slot_fires_once_and_only_forward(self, store: Store) -> None:
        store.add_schedule(SPEC, actor="cli")
        run = store.fire_slot("nightly", 120.0, new_run("nightly-2"), ["load", "train"], actor="schedule:nightly")
        assert run is not None and run.state == RunState.PENDING and run.params == new_run().params
        assert [t.step for t in store.get_tasks("nightly-2")] == ["load", "train"]
        created = store.list_events("nightly-2")
        assert [(e.kind, e.to_state, e.data["schedule"], e.data["slot"]) for e in created] == [
            ("run", "PENDING", "nightly", 120.0)]
        s = store.get_schedule("nightly")
        assert (s.last_slot, s.last_run) == (120.0, "nightly-2")
        # The same slot again, or an older one: nothing is created.
        assert store.fire_slot("nightly", 120.0, new_run("nightly-2b"), ["load"], actor="t") is None
        assert store.fire_slot("nightly", 60.0, new_run("nightly-1"), ["load"], actor="t") is None
        assert store.skip_slot("nightly", 120.0, actor="t", reason="r") is False
        assert [r.run_id for r in store.list_runs()] == ["nightly-2"]
        # A paused schedule fires nothing, and skips nothing.
        store.set_schedule_paused("nightly", True, actor="cli")
        assert store.fire_slot("nightly", 180.0, new_run("nightly-3"), ["load"], actor="t") is None
        assert store.skip_slot("nightly", 180.0, actor="t", reason="r") is False
        store.set_schedule_paused("nightly", False, actor="cli")
        assert store.fire_slot("nightly", 180.0, new_run("nightly-3"), ["load"], actor="t") is not None

    def test_a_skipped_slot_moves_the_fence_and_says_why_on_the_run_still_going(self, store: Store) -> None:
        store.add_schedule(SPEC, actor="cli")
        store.fire_slot("nightly", 60.0, new_run("nightly-1"), ["load"], actor="t")
        assert store.skip_slot("nightly", 120.0, actor="schedule:nightly", reason="still RUNNING",
                               run_id="nightly-1")
        s = store.get_schedule("nightly")
        assert (s.last_slot, s.last_run, s.last_error) == (120.0, "nightly-1", None)
        ev = store.list_events("nightly-1", kinds=("schedule",))
        assert [(e.actor, e.reason, e.data) for e in ev] == [
            ("schedule:nightly", "still RUNNING", {"schedule": "nightly", "slot": 120.0, "skipped": True})]
        # A slot that could not fire keeps its reason on the schedule, until one fires.
        assert store.skip_slot("nightly", 180.0, actor="t", reason="no flow", error="flow gone")
        assert store.get_schedule("nightly").last_error == "flow gone"
        store.fire_slot("nightly", 240.0, new_run("nightly-4"), ["load"], actor="t")
        assert store.get_schedule("nightly").last_error is None

    def test_a_run_id_taken_already_takes_the_slot_and_says_so(self, store: Store) -> None:
        store.add_schedule(SPEC, actor="cli")
        store.create_run(new_run("nightly-1"), ["load"], actor="cli")
        assert store.fire_slot("nightly", 60.0, new_run("nightly-1"), ["load"], actor="t") is None
        s = store.get_schedule("nightly")
        assert s.last_slot == 60.0 and s.last_run is None and "already exists" in (s.last_error or "")
        assert len(store.list_events("nightly-1")) == 1  # the run itself was left alone


# -- processes racing -------------------------------------------------------------------------

TICK_FLOW = '''from segue import Flow

flow = Flow("tick", params={"n": 1})


@flow.step()
def only(ctx):
    return ctx.params["n"]
'''


class Racers:
    """Firing loops in processes of their own (``_schedule_racer.py``), one per host name."""

    def __init__(self, tmp: Path, target: str, env: dict[str, str]) -> None:
        self.tmp, self.target, self.env = tmp, target, env
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, host: str, **extra: str) -> None:
        with open(self.tmp / f"err-{host}.log", "a") as err:  # the child keeps its own descriptor
            p = subprocess.Popen(
                [sys.executable, str(HERE / "_schedule_racer.py"), self.target, str(self.tmp / "home"), host,
                 str(self.tmp / f"out-{host}.jsonl")],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, text=True,
                env={**self.env, **extra, "PYTHONPATH": str(HERE)})
        self.procs[host] = p
        assert p.stdout is not None and p.stdout.readline().strip() == "ready", (self.tmp / f"err-{host}.log").read_text()

    def kill(self, host: str) -> None:
        p = self.procs.pop(host)
        if p.poll() is None:
            p.kill()
        p.wait()
        if p.stdout is not None:
            p.stdout.close()

    def stop(self) -> None:
        for host in list(self.procs):
            self.kill(host)

    def records(self) -> list[dict]:
        return [json.loads(line) for f in sorted(self.tmp.glob("out-*.jsonl")) for line in f.read_text().splitlines()]


@pytest.fixture
def racing(tmp_path: Path, new_target: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
           request: pytest.FixtureRequest):
    target = new_target(request.param)
    clock = VirtualClock(tmp_path / "clock")
    monkeypatch.setenv("SEGUE_CLOCK_FILE", str(tmp_path / "clock"))  # this process's store too
    flow = tmp_path / "tick.py"
    flow.write_text(TICK_FLOW)
    store = open_target(target)
    racers = Racers(tmp_path, target, {**os.environ, **clock.env})
    try:
        yield store, clock, racers, flow
    finally:
        racers.stop()
        store.close()


def _at(clock: VirtualClock, t: float) -> None:
    """Set the shared virtual clock so that it reads ``t`` now (it runs on from there)."""
    clock.advance(t - clock())


def _add(store: Store, flow: Path, **kw: str) -> float:
    """Add the every-minute schedule "tick"; its first slot."""
    from segue.run.schedules import add_schedule
    from segue.scheduler.schedules import next_slot

    s = add_schedule(store, "tick", str(flow), cron="* * * * *", actor="test", **kw)
    return next_slot(s.cron, s.tz, s.created_at)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("racing", BACKENDS, indirect=True)
def test_three_agents_fire_each_of_100_slots_exactly_once(racing) -> None:
    from segue.scheduler.schedules import slot_run_id

    store, clock, racers, flow = racing
    first = _add(store, flow, catch_up="all", overlap="queue")
    for host in "abc":
        racers.start(host)
    slots = [first + 60 * i for i in range(100)]
    for i, slot in enumerate(slots):
        _at(clock, slot + 1)  # one second into the slot: every agent sees it due
        if i == 50:
            racers.kill("b")  # an agent dies at a slot boundary (before or while it fires)
        run_id = slot_run_id("tick", slot)
        wait_for(lambda: any(r.run_id == run_id and r.state == RunState.SUCCEEDED
                             for r in store.list_runs(limit=3)), 60, f"slot {i}'s run {run_id} to finish")
        if i == 60:
            racers.start("b")  # back again (its lease of runs it claimed died with it)
    runs = store.list_runs()
    assert sorted(r.run_id for r in runs) == sorted(slot_run_id("tick", s) for s in slots)
    assert all(r.state == RunState.SUCCEEDED for r in runs)
    for r in runs:  # created once each, by one agent, and started once each
        created = [e for e in store.list_events(r.run_id) if e.kind == "run" and e.to_state == "PENDING"]
        assert len(created) == 1, (r.run_id, created)
    records = racers.records()
    fired = Counter(x["fired"] for x in records if "fired" in x)
    started = Counter(x["started"] for x in records if "started" in x)
    assert max(fired.values()) == 1 and max(started.values()) == 1
    assert len(fired) >= 99 and len(started) >= 99  # the killed agent may have taken one record with it
    assert store.get_schedule("tick").last_slot == slots[-1]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("racing", BACKENDS, indirect=True)
def test_an_agent_killed_after_firing_leaves_the_run_to_another(racing) -> None:
    from segue.scheduler.schedules import slot_run_id

    store, clock, racers, flow = racing
    first = _add(store, flow)
    racers.start("a", SEGUE_FAULTS="schedule.after_fire:kill:1")
    _at(clock, first + 1)
    run_id = slot_run_id("tick", first)
    wait_for(lambda: racers.procs["a"].poll() is not None, 60, "agent a to fire and die")
    assert racers.procs["a"].returncode == -signal.SIGKILL
    racers.kill("a")
    run = store.get_run(run_id)
    assert run.state == RunState.PENDING and run.controller_epoch == 0  # fired, never started
    racers.start("b")
    started = wait_for(lambda: [x for x in racers.records() if "started" in x], 60, "agent b to start the run")
    assert started == [{"started": run_id, "host": "b", "claim": 1}]
    assert store.get_run(run_id).state == RunState.SUCCEEDED
    assert store.get_schedule("tick").last_slot == first
    # The environment a run records at submit, recorded by the agent that started it.
    [env] = store.list_events(run_id, kinds=("environment",))
    assert env.actor == "agent:b" and env.data["at"] == "submit"
