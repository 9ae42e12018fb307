"""`segue schedule` through the real CLI, and `segue agent` processes firing a schedule's
slots on a virtual clock (``SEGUE_CLOCK_FILE``, shared by every process): each slot's
run is created once, started by a real controller, and completes; an agent killed at a
slot boundary loses no slot. On SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue, VirtualClock, wait_for

from segue.scheduler.schedules import next_slot, slot_run_id

COUNTER = str(FLOWS / "counter.py")


def test_add_ls_pause_resume_rm(segue: Segue) -> None:
    out = segue("schedule", "add", "nightly", COUNTER, "--cron", "0 2 * * *", "--tz", "Europe/Berlin",
                "-p", "n=5", "--priority", "batch", "--catch-up", "latest", "--overlap", "queue")
    assert out.returncode == 0, out.stderr
    assert "schedule nightly added: 0 2 * * * (Europe/Berlin); next slot" in out.stdout
    [row] = segue.json("schedule", "ls")
    assert {k: row[k] for k in ("name", "cron", "tz", "catch_up", "overlap", "paused", "last_slot", "last_run")} == {
        "name": "nightly", "cron": "0 2 * * *", "tz": "Europe/Berlin", "catch_up": "latest", "overlap": "queue",
        "paused": False, "last_slot": None, "last_run": None}
    assert row["flow"] == str(Path(COUNTER).resolve()) and row["params"]["n"] == 5 and row["priority"] == 0
    assert row["next_slot"] == next_slot("0 2 * * *", "Europe/Berlin", row["created_at"])
    text = segue("schedule", "ls").stdout
    assert "nightly" in text and "active" in text and "next " in text and "CE" in text
    assert segue("schedule", "pause", "nightly").stdout.strip() == "schedule nightly paused"
    assert segue.json("schedule", "ls")[0]["paused"] is True
    assert "PAUSED" in segue("schedule", "ls").stdout
    assert segue("schedule", "resume", "nightly").stdout.strip() == "schedule nightly resumed"
    assert segue.json("schedule", "ls")[0]["paused"] is False
    assert segue("schedule", "rm", "nightly").returncode == 0
    assert segue.json("schedule", "ls") == []
    assert "no schedules" in segue("schedule", "ls").stdout


@pytest.mark.parametrize(("args", "message"), [
    (["add", "n", COUNTER, "--cron", "0 25 * * *"], "cron '0 25 * * *': its hour field '25' is invalid"),
    (["add", "n", COUNTER, "--cron", "0 2 * *"], "must have 5 fields"),
    (["add", "n", COUNTER, "--cron", "0 2 * * *", "--tz", "Mars/Olympus"], "unknown time zone 'Mars/Olympus'"),
    (["add", "n", COUNTER, "--cron", "0 2 * * *", "--catch-up", "most"], "argument --catch-up: invalid choice"),
    (["add", "n", COUNTER, "--cron", "0 2 * * *", "--overlap", "both"], "argument --overlap: invalid choice"),
    (["add", "n", COUNTER, "--cron", "0 2 * * *", "-p", "nope=1"], "unknown parameter 'nope'"),
    (["add", "n", COUNTER, "--cron", "0 2 * * *", "-p", "n=many"], "parameter 'n' expects int"),
    (["add", "n", "/no/such/flow.py", "--cron", "0 2 * * *"], "does not exist"),
    (["add", "a/b", COUNTER, "--cron", "0 2 * * *"], "schedule name 'a/b' is invalid"),
    (["add", "n", COUNTER], "--cron"),
    (["pause", "ghost"], "unknown schedule 'ghost'"),
    (["resume", "ghost"], "unknown schedule 'ghost'"),
    (["rm", "ghost"], "unknown schedule 'ghost'"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(segue: Segue, args: list[str], message: str) -> None:
    out = segue("schedule", *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stderr.startswith("segue: ") and out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
    assert segue.json("schedule", "ls") == []


def test_a_duplicate_name_is_refused(segue: Segue) -> None:
    assert segue("schedule", "add", "n", COUNTER, "--cron", "0 2 * * *").returncode == 0
    out = segue("schedule", "add", "n", COUNTER, "--cron", "0 3 * * *")
    assert out.returncode == 2 and out.stderr.strip() == (
        "segue: schedule 'n' already exists; `segue schedule rm n` first, or pick another name")
    assert [r["cron"] for r in segue.json("schedule", "ls")] == ["0 2 * * *"]


# -- agents firing ----------------------------------------------------------------------------

class Agents:
    def __init__(self, segue: Segue, root: Path) -> None:
        self.segue, self.root = segue, root
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def start(self, host: str) -> None:
        with open(self.root / f"agent-{host}.log", "a") as log:  # the child keeps its own descriptor
            self.procs[host] = subprocess.Popen(
                [sys.executable, "-m", "segue", "agent", "--host-id", host, "--ttl", "3", "--poll", "0.2"],
                stdout=log, stderr=subprocess.STDOUT, text=True, env=self.segue.env)
        pid = self.procs[host].pid
        wait_for(lambda: any(h["host"] == host and h["pid"] == pid and h["alive"]
                             for h in self.segue.json("hosts")), 60, f"agent {host} to register")

    def kill(self, host: str) -> None:
        p = self.procs.pop(host)
        p.kill()
        p.wait()

    def stop(self) -> None:
        for host in list(self.procs):
            self.kill(host)


@pytest.fixture(params=["sqlite", "postgres"])
def home(request: pytest.FixtureRequest, segue: Segue, tmp_path: Path) -> Iterator[tuple[Segue, VirtualClock]]:
    if request.param == "postgres":
        pg = request.getfixturevalue("pg_server")
        if isinstance(pg, str):
            pytest.skip(pg)
        segue.env["SEGUE_STORE"] = pg.create_database()
    clock = VirtualClock(tmp_path / "clock")
    segue.env.update(clock.env)
    yield segue, clock


@pytest.fixture
def agents(home: tuple[Segue, VirtualClock], tmp_path: Path) -> Iterator[Agents]:
    a = Agents(home[0], tmp_path)
    try:
        yield a
    finally:
        a.stop()


def _at(clock: VirtualClock, t: float) -> None:
    clock.advance(t - clock())


def _finished(segue: Segue, run_id: str) -> Callable[[], bool]:
    def done() -> bool:
        runs = {r["run_id"]: r["state"] for r in segue.json("ls")}
        return runs.get(run_id) == "SUCCEEDED"
    return done


@pytest.mark.timeout(300)
def test_agents_fire_each_slot_once_and_the_runs_complete(home: tuple[Segue, VirtualClock],
                                                          agents: Agents) -> None:
    segue, clock = home
    assert segue("schedule", "add", "tick", COUNTER, "--cron", "* * * * *", "-p", "n=3", "-p", "sleep=0",
                 "--catch-up", "all", "--overlap", "queue").returncode == 0
    [row] = segue.json("schedule", "ls")
    first = row["next_slot"]
    for host in ("a", "b"):
        agents.start(host)
    slots = [first + 60 * i for i in range(3)]
    for i, slot in enumerate(slots):
        _at(clock, slot + 1)
        if i == 1:
            agents.kill("a")  # at a slot boundary: b fires it alone
        wait_for(_finished(segue, slot_run_id("tick", slot)), 120, f"slot {i}'s run to complete")
    runs = segue.json("ls")
    assert sorted(r["run_id"] for r in runs) == sorted(slot_run_id("tick", s) for s in slots)
    for r in runs:
        created = [e for e in segue.events(r["run_id"]) if e["kind"] == "run" and e["to_state"] == "PENDING"]
        assert len(created) == 1 and created[0]["actor"] == "schedule:tick"
        assert segue.output(r["run_id"], "count")["i"] == 3
    [row] = segue.json("schedule", "ls")
    assert row["last_slot"] == slots[-1] and row["last_run_state"] == "SUCCEEDED"
    assert row["last_run"] == slot_run_id("tick", slots[-1])
    ls = segue("schedule", "ls").stdout
    assert f"-> {slot_run_id('tick', slots[-1])} SUCCEEDED" in ls, ls
    assert json.loads(segue("schedule", "ls", "--json").stdout)[0]["last_error"] is None
