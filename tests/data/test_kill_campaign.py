"""Exactly once under real SIGKILLs (workers and controller) and pause/resume, via the CLI.

CI runs a 100k-record campaign with 20 landed SIGKILLs for the JSONL and SQL
sinks and a reduced one for the others; the 1M-record, 50-kill campaign over
every sink is marked slow (``pytest -m slow``). Every campaign asserts the
faults that *landed* (see :class:`Campaign`), not the ones it meant to inject.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from segue.run.procs import pid_alive, wait_dead

FLOW = str(Path(__file__).parent / "flows" / "mapflow.py")
# A long lease: the campaign's faults are SIGKILLs, seen at once by their exit; a short
# lease would only add "lease expired" kills of workers that start slowly on a loaded box.
FAST = {"SEGUE_LEASE_TTL_S": "30", "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05",
        "SEGUE_PAUSE_DEADLINE_S": "20"}
SINKS = ["jsonl", "parquet", "sqlite", "external"]


def make_input(d: Path, n: int, files: int = 4) -> str:
    d.mkdir(parents=True, exist_ok=True)
    handles = [open(d / f"in-{i}.jsonl", "w") for i in range(files)]
    for k in range(n):
        handles[k % files].write(json.dumps({"k": k, "v": f"value-{k:08d}"}) + "\n")
    for h in handles:
        h.close()
    return str(d / "in-*.jsonl")


def read_output(kind: str, out: Path) -> list[tuple[int, str]]:
    if kind == "jsonl":
        rows = []
        for p in sorted(out.glob("part-*.jsonl")):
            with open(p) as f:
                rows.extend((r["k"], r["v"]) for r in map(json.loads, f))
        return rows
    if kind == "parquet":
        import pyarrow.parquet as pq

        return [(r["k"], r["v"]) for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    if kind == "sqlite":
        with sqlite3.connect(out / "out.db") as c:
            return c.execute("SELECT k, v FROM results").fetchall()
    with sqlite3.connect(out / "receiver.db") as c:
        return [(b["k"], b["v"]) for b in (json.loads(x) for (x,) in c.execute("SELECT body FROM got"))]


def start(s: Any, run_id: str, inp: str, out: Path, kind: str, sleep_every: int, shard_bytes: int,
          hold: Path, n: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"out={out}", "-p", f"sink={kind}",
      "-p", f"sleep_every={sleep_every}", "-p", f"shard_bytes={shard_bytes}",
      "-p", f"hold={hold}", "-p", f"hold_k={n - 1}", "--detach", check=True)


class Campaign:
    """Faults aimed at a live run, each gated on observed progress, counted when they land.

    A kill *lands* when its target (the run's current worker or controller)
    was a live process the moment SIGKILL was sent; a pause lands when the run
    reached PAUSED with its step PARKED. A fault whose target was already gone
    is counted as missed and aimed again, so the landed counts are what the
    run really went through. Before each fault the current attempt must have
    committed new checkpoints since the previous fault: every fault interrupts
    real progress, on a slow machine as on a fast one. The flow's hold keeps
    the last record waiting until every fault landed, so the run cannot finish
    first.
    """

    def __init__(self, s: Any, run_id: str, hold: Path, timeout: float) -> None:
        from segue.home import Home

        self.s, self.run_id, self.hold = s, run_id, hold
        self.store = Home.resolve(s.home).open_store()
        self.landed: Counter[str] = Counter()
        self.missed: Counter[str] = Counter()
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout
        self.last_seq = 0
        self.log: list[str] = []  # what landed when, for the failure message

    # -- what the store says ---------------------------------------------------
    def _task(self) -> Any:
        return self.store.get_tasks(self.run_id)[0]

    def _newest(self) -> Any:
        cks = self.store.list_checkpoints(self.run_id, self._task().step)
        return cks[0] if cks else None

    def recorded_worker_sigkills(self) -> int:
        # Transitions only: a failure also leaves a "failure" event with the same words.
        return sum("killed by SIGKILL" in e.reason for e in self.store.list_events(self.run_id)
                   if e.actor == "failure-detector" and e.kind == "task")

    def _progressed(self, checkpoints: int) -> Any:
        """The running attempt, once it committed ``checkpoints`` new checkpoints since the last fault."""
        self._ensure_driven()
        t, c = self._task(), self._newest()
        if t.state.value != "RUNNING" or not pid_alive(t.pid):
            return None
        progressed = c is not None and c.epoch == t.epoch and c.seq >= self.last_seq + checkpoints
        # An attempt held at the last record can commit no more: it made all the progress it can.
        held = os.path.exists(f"{self.hold}.held-{t.epoch}")
        return t if progressed or held else None

    def _wait(self, pred: Any, what: str) -> Any:
        while time.monotonic() < self.deadline:
            got = pred()
            if got:
                return got
            time.sleep(0.02)
        raise AssertionError(f"campaign timed out waiting for {what}: landed {dict(self.landed)}, "
                             f"missed {dict(self.missed)}, run {self.store.get_run(self.run_id).state}, "
                             f"task {self._task()}, newest {self._newest()}, log {self.log}")

    # -- faults ----------------------------------------------------------------
    def fire(self, action: str, checkpoints: int) -> None:
        while True:
            t = self._wait(lambda: self._progressed(checkpoints), f"progress before {action}")
            newest = self._newest()
            self.last_seq = newest.seq if newest is not None else 0
            if self._fire(action, t):
                self.landed[action] += 1
                self.log.append(f"{time.monotonic() - self.t0:.1f}s {action} epoch {t.epoch}")
                return
            self.missed[action] += 1

    def _fire(self, action: str, t: Any) -> bool:
        if action == "pause":
            proc = self.s("pause", self.run_id, "--wait", "--timeout", "120")
            assert proc.returncode == 0, proc.stderr
            run, task = self.store.get_run(self.run_id), self._task()
            assert task.state.value != "SUCCEEDED", "the hold failed: the step finished during a pause"
            return run.state.value == "PAUSED" and task.state.value == "PARKED"
        if action == "kill_controller":
            pid = self.store.get_run(self.run_id).controller_pid
        else:
            pid = t.pid
        if not pid_alive(pid):
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        assert wait_dead(pid, 30), f"{action}: pid {pid} survived SIGKILL"
        if action == "kill_worker":
            # The next fault is aimed only once the controller dealt with this one.
            self._wait(lambda: self._task().epoch != t.epoch or self._task().state.value != "RUNNING"
                       or not pid_alive(self.store.get_run(self.run_id).controller_pid),
                       "the controller to notice the killed worker")
        return True

    def _ensure_driven(self) -> None:
        """Resume a paused run, or one whose controller was killed."""
        run = self.store.get_run(self.run_id)
        state = run.state.value
        assert state != "FAILED", self.s.status(self.run_id)
        if state == "SUCCEEDED":
            return
        if state in ("RUNNING", "PAUSING") and pid_alive(run.controller_pid):
            return
        if state == "PAUSING":  # its controller died mid-pause: finish the pause first
            self.s("pause", self.run_id, "--wait", "--timeout", "60")
            return
        proc = self.s("resume", self.run_id, "--detach")
        # A refusal means a controller is starting up (or just took over): look again next poll.
        assert proc.returncode in (0, 2), proc.stderr

    def finish(self) -> None:
        self.hold.write_text("go")
        self._wait(lambda: (self._ensure_driven(), self.store.get_run(self.run_id).state.value)[1]
                   == "SUCCEEDED", "the run to finish")


def campaign(s: Any, run_id: str, hold: Path, seed: int, kills: int, pauses: int,
             controller_every: int = 4, timeout: float = 840) -> dict[str, Any]:
    """Land ``kills`` SIGKILLs (every ``controller_every``-th of the controller) and ``pauses``
    pauses at seeded progress points, then let the run finish. Returns what landed."""
    rng = random.Random(seed)
    t0 = time.monotonic()
    kill_plan = ["kill_controller" if (i + 1) % controller_every == 0 else "kill_worker"
                 for i in range(kills)]
    # Pauses go among the first faults (a pause of a held step waits for the pause deadline).
    early = ["pause"] * pauses + kill_plan[: pauses + 2]
    rng.shuffle(early)
    c = Campaign(s, run_id, hold, timeout)
    for action in early + kill_plan[pauses + 2:]:
        # One or two new checkpoints: the run has far more (the hold would stall a greedier gate).
        c.fire(action, rng.randint(1, 2))
    c.finish()
    return {"landed": dict(c.landed), "missed": dict(c.missed),
            "recorded_worker_sigkills": c.recorded_worker_sigkills(),
            "seconds": round(time.monotonic() - t0, 1)}


def check_exactly_once(got: list[tuple[int, str]], n: int, clean: list[tuple[int, str]] | None = None) -> None:
    counts = Counter(k for k, _ in got)
    dupes = [k for k, c in counts.items() if c > 1]
    lost = set(range(n)) - set(counts)
    assert not dupes and not lost, f"{len(dupes)} duplicated (e.g. {dupes[:5]}), {len(lost)} lost"
    assert sorted(got) == sorted(clean) if clean is not None else True
    assert all(v == f"VALUE-{k:08d}" for k, v in got)


def run_campaign(segue_cls: type, tmp_path: Path, kind: str, n: int, kills: int, pauses: int, seed: int,
                 sleep_every: int, shard_bytes: int, with_clean: bool, timeout: float = 840,
                 ) -> dict[str, Any]:
    s = segue_cls(tmp_path / "home")
    s.env.update(FAST)
    inp = make_input(tmp_path / "in", n)
    clean = None
    if with_clean:
        cs = segue_cls(tmp_path / "clean-home")
        cs.env.update(FAST)
        out = tmp_path / "clean-out"
        out.mkdir()
        proc = cs("run", FLOW, "--run-id", "clean", "-p", f"input={inp}", "-p", f"out={out}", "-p",
                  f"sink={kind}", "-p", f"shard_bytes={shard_bytes}", timeout=600)
        assert proc.returncode == 0, proc.stderr
        clean = read_output(kind, out)
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    start(s, "faulty", inp, out, kind, sleep_every, shard_bytes, hold, n)
    try:
        done = campaign(s, "faulty", hold, seed, kills, pauses, timeout=timeout)
    finally:
        # A failed campaign must not leave a held run (controller and worker) behind.
        hold.write_text("go")
        s("cancel", "faulty")
    got = read_output(kind, out)
    check_exactly_once(got, n, clean)
    if kind == "external":
        with sqlite3.connect(out / "receiver.db") as c:
            done["resent_same_key"] = c.execute("SELECT coalesce(sum(n - 1), 0) FROM got").fetchone()[0]
    print(f"campaign {kind} n={n}: {done}")  # shown with -s or -rP: the figures for the record
    return done


def assert_landed(done: dict[str, Any], kills: int, pauses: int, controller_every: int = 4) -> None:
    landed = done["landed"]
    want_ctl = kills // controller_every
    assert landed.get("kill_controller", 0) == want_ctl, done
    assert landed.get("kill_worker", 0) == kills - want_ctl, done
    assert landed.get("pause", 0) == pauses, done
    # The store saw the worker kills too: each one is recorded by the failure detector,
    # except one hidden by a controller killed before it reaped its worker.
    assert done["recorded_worker_sigkills"] >= landed["kill_worker"] - want_ctl, done


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
@pytest.mark.timeout(900)
def test_ci_kill_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    """The campaign CI runs: 100k records, 20 landed SIGKILLs (15 workers, 5 controllers), 2 pauses."""
    done = run_campaign(type(segue), tmp_path, kind, n=100_000, kills=20, pauses=2,
                        seed=10 + ["jsonl", "sqlite"].index(kind), sleep_every=20,
                        shard_bytes=400_000, with_clean=kind == "jsonl")
    assert_landed(done, kills=20, pauses=2)


@pytest.mark.parametrize("kind", ["parquet", "external"])
@pytest.mark.timeout(900)
def test_reduced_kill_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=10_000, kills=5, pauses=2, seed=SINKS.index(kind) + 1,
                        sleep_every=2, shard_bytes=60_000, with_clean=False)
    assert_landed(done, kills=5, pauses=2)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("kind", SINKS)
def test_million_record_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=1_000_000, kills=50, pauses=6, seed=100 + SINKS.index(kind),
                        sleep_every=20, shard_bytes=4_000_000, with_clean=True, timeout=3300)
    assert_landed(done, kills=50, pauses=6)
