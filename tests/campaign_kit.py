"""Fault campaigns against a live run through the real CLI: SIGKILLs of workers and
controllers and pauses, each gated on observed progress and counted when it lands.

The run's flow must hold its last record until the campaign's ``hold`` file
exists and say so with ``HOLD.held-EPOCH`` or ``HOLD.held-pidPID`` (the attempt
can commit no more); see tests/data/flows/mapflow.py.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from segue._procs import pid_alive, wait_dead

# Fast retries and a short pause deadline for campaign runs (a test's ``s.env.update(FAST)``).
FAST = {
    "SEGUE_LEASE_TTL_S": "30",
    "SEGUE_BACKOFF_BASE_S": "0.01",
    "SEGUE_BACKOFF_MAX_S": "0.05",
    "SEGUE_PAUSE_DEADLINE_S": "20",
}


def check_keys_once(got: list[tuple[int, str]], n: int) -> None:
    """Every key 0..n-1 exactly once with its value as the queue flows transform it
    (``VALUE-%08d``): what a clean run publishes (tests/data/flows/queueflow.py)."""
    counts = Counter(k for k, _ in got)
    dupes = [k for k, c in counts.items() if c > 1]
    lost = set(range(n)) - set(counts)
    assert not dupes and not lost, f"{len(dupes)} duplicated (e.g. {dupes[:5]}), {len(lost)} lost"
    assert sorted(got) == [(k, f"VALUE-{k:08d}") for k in range(n)]


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
        held = (os.path.exists(f"{self.hold}.held-{t.epoch}")
                or os.path.exists(f"{self.hold}.held-pid{t.pid}"))
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
    def land_armed_kill(self, commits: int, name: str = "kill_before_ack") -> None:
        """Count the SIGKILL that a fault point armed for epoch 1 only gave the first attempt
        right after its ``commits``-th commit (``SEGUE_FAULTS=POINT:kill:N``,
        ``SEGUE_FAULTS_EPOCHS=1``): it lands once epoch 2 started and the store recorded it."""
        self._wait(lambda: self._task().epoch >= 2, f"the first attempt to die ({name})")
        first = [ck for ck in self.store.list_checkpoints(self.run_id, self._task().step)
                 if ck.epoch == 1]
        assert len(first) == commits, first  # it died right after that commit
        self._wait(lambda: self.recorded_worker_sigkills() >= 1, "the store to record the SIGKILL")
        self.landed[name] += 1
        self.log.append(f"{time.monotonic() - self.t0:.1f}s {name} epoch 1")

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



def assert_landed(done: dict[str, Any], kills: int, pauses: int, controller_every: int = 4) -> None:
    landed = done["landed"]
    want_ctl = kills // controller_every
    assert landed.get("kill_controller", 0) == want_ctl, done
    assert landed.get("kill_worker", 0) == kills - want_ctl, done
    assert landed.get("pause", 0) == pauses, done
    # The store saw the worker kills too: each one is recorded by the failure detector,
    # except one hidden by a controller killed before it reaped its worker.
    assert done["recorded_worker_sigkills"] >= landed["kill_worker"] - want_ctl, done
