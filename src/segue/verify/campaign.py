"""`segue verify`: run a flow cleanly and under seeded faults, then compare.

Each run gets its own sandbox directory (its working directory and its segue
home) and its own run id (``verify-clean``, ``verify-faulted``), so relative
sink paths of the two runs never meet; a sink path that would leave the
sandbox is remapped into it or refused before anything runs
(segue.verify.sandbox). The faulted run is driven as an operator would:
detached controllers, SIGKILLs of workers and controllers, pause/resume
cycles, and resumes after each crash.

A verify that compared nothing (a flow with sinks whose sandboxes hold no
record, or one with neither step outputs nor files) fails: it proved nothing.

Faults are planned at seeded points of the run's progress (a fraction of the
work the clean run reported through ``ctx.progress``; for flows that report
none, of the clean run's duration) and fire when the faulted run gets there,
so where they land does not depend on how fast the machine is. The report counts the
faults that *landed*: a kill lands when the process it aimed at was alive
(the same process: its start time is checked against pid reuse) and is dead
after the signal; a worker is only aimed at once it checkpointed or
heartbeat (past its start-up); a pause lands when the run reached PAUSED.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._procs import controller_alive, pid_alive, wait_dead
from ..errors import UsageError
from ..flow import load_flow, parse_overrides, resolve
from ..home import Home
from ..states import RunState, TaskState
from .compare import Diff, compare, snapshot
from .reaper import MARK
from .sandbox import anchor_inputs, escaped, keep_inside

# Different ids: a sink refuses a directory another run owns, so if the runs
# ever met (an escaped path), the faulted run is refused instead of silently
# replacing the clean run's output.
CLEAN_ID, FAULTED_ID = "verify-clean", "verify-faulted"
KINDS = ("worker", "controller", "pause")


@dataclass
class Fault:
    at: float  # a fraction of the run's work, in [0.05, 0.9]
    kind: str  # "worker" | "controller" | "pause"


@dataclass
class Report:
    clean_s: float
    faulted_s: float
    faults: list[dict[str, Any]] = field(default_factory=list)
    diff: Diff = field(default_factory=Diff)
    work_redone_s: float = 0.0
    clean_state: str = ""
    faulted_state: str = ""
    paused_s: float = 0.0
    min_faults: int | None = None  # None: every planned fault must land
    has_sinks: bool = False  # declared by @flow.map, or reported by a step's output
    escaped: list[str] = field(default_factory=list)  # sinks outside their run's sandbox
    remapped: dict[str, str] = field(default_factory=dict)  # parameter -> the path each run got

    @property
    def nothing_compared(self) -> str | None:
        """Why the comparison proved nothing, or None."""
        d = self.diff
        if self.has_sinks and d.records == 0:
            return ("the flow has sinks, but the clean run's sandbox holds no record of them; check "
                    "that its input is not empty and that its sinks write inside the sandbox")
        if d.records == 0 and d.outputs == 0 and not d.missing_files and not d.extra_files:
            return "the runs returned no step output and wrote no file in their sandboxes"
        return None

    @property
    def compared(self) -> bool:
        return not self.escaped and self.nothing_compared is None

    @property
    def planned(self) -> int:
        return len(self.faults)

    @property
    def landed(self) -> int:
        return sum(1 for f in self.faults if f["landed"])

    @property
    def enough_faults(self) -> bool:
        need = self.planned if self.min_faults is None else self.min_faults
        return self.landed >= need

    @property
    def identical(self) -> bool:
        return self.agree and self.compared

    @property
    def agree(self) -> bool:
        """Nothing differs (which proves something only if something was compared)."""
        return self.diff.identical and self.clean_state == self.faulted_state == "SUCCEEDED"

    @property
    def verdict(self) -> str:
        if self.escaped:
            return "NOT COMPARED"
        return "IDENTICAL" if self.identical else "NOTHING COMPARED" if self.agree else "DIFFERENT"

    def problems(self) -> list[str]:
        """One line each: why the runs could not be compared."""
        why = self.nothing_compared
        return self.escaped + ([f"nothing was compared: {why}"] if why and not self.escaped else [])

    @property
    def ok(self) -> bool:
        """Identical outputs, proven under at least the faults asked for."""
        return self.identical and self.enough_faults

    def to_json(self) -> dict[str, Any]:
        d = self.diff
        planned = Counter(f["kind"] for f in self.faults)
        landed = Counter(f["kind"] for f in self.faults if f["landed"])
        return {
            "ok": self.ok,
            "identical": self.identical,
            "verdict": self.verdict,
            "nothing_compared": self.nothing_compared is not None,
            "outputs_escaped": self.escaped,
            "params_remapped": self.remapped,
            "run_ids": {"clean": CLEAN_ID, "faulted": FAULTED_ID},
            "clean_state": self.clean_state,
            "faulted_state": self.faulted_state,
            "faults_planned": {k: planned[k] for k in KINDS if planned[k]},
            "faults_landed": {k: landed[k] for k in KINDS if landed[k]},
            "faults_injected": {k: landed[k] for k in KINDS if landed[k]},  # older name of landed
            "faults_missed": [f for f in self.faults if not f["landed"]],
            "min_faults": self.planned if self.min_faults is None else self.min_faults,
            "enough_faults": self.enough_faults,
            "faults": self.faults,
            "records_compared": d.records,
            "step_outputs_compared": d.outputs,
            "records_lost": d.lost,
            "records_duplicated": d.duplicated,
            "records_differing": d.differing,
            "missing_files": d.missing_files,
            "extra_files": d.extra_files,
            "differing_step_outputs": d.differing_outputs,
            "examples": d.examples,
            "clean_s": round(self.clean_s, 3),
            "faulted_s": round(self.faulted_s, 3),
            "time_lost_to_recovery_s": round(max(0.0, self.faulted_s - self.clean_s - self.paused_s), 3),
            "work_redone_s": round(self.work_redone_s, 3),
        }


def plan(seed: int, kills: int, pauses: int, controller_share: float = 0.25) -> list[Fault]:
    """The seeded schedule of faults over [5%, 90%] of the run's work."""
    rnd = random.Random(seed)
    faults = []
    for _ in range(kills):
        kind = "controller" if rnd.random() < controller_share else "worker"
        faults.append(Fault(rnd.uniform(0.05, 0.9), kind))
    for _ in range(pauses):
        faults.append(Fault(rnd.uniform(0.05, 0.9), "pause"))
    return sorted(faults, key=lambda f: f.at)


class _Cli:
    def __init__(self, workdir: Path, sandbox: Path, pool: Path | str | None, run_id: str,
                 store: str | None = None) -> None:
        self.workdir = workdir
        self.run_id = run_id
        self.store_url = store
        # The sandboxes use the pool of the home verify was started from: a GPU
        # flow is placed on the same devices, and waits for the same runs.
        # So is the store verify was given (segue --store). Both as a user would set them
        # for a command, in its environment: a PostgreSQL URL stays out of argv.
        # MARK: every process started from here carries it, so the reaper finds
        # them all (segue.verify.reaper), whatever ends the verify.
        self.env = {**os.environ, "SEGUE_HOME": str(workdir / ".segue"), "PYTHONUNBUFFERED": "1",
                    MARK: str(sandbox), **({"SEGUE_POOL": str(pool)} if pool is not None else {}),
                    **({"SEGUE_STORE": store} if store else {})}
        self._store: Any = None

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "segue", *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True)
        if check and proc.returncode not in (0, 3):
            raise RuntimeError(f"segue {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    @property
    def store(self) -> Any:
        # Read directly (milliseconds), not through `segue status` (a process
        # start): faults are gated on progress, polled often.
        if self._store is None:
            self._store = Home.resolve(self.workdir / ".segue", store=self.store_url).open_store()
        return self._store

    def state(self) -> RunState:
        return self.store.get_run(self.run_id).state

    def run_args(self, flow: Path, params: Mapping[str, str]) -> list[str]:
        out = ["run", str(flow), "--run-id", self.run_id]
        for k, v in params.items():
            out += ["--param", f"{k}={v}"]
        return out


def run_verify(
    flow: Path, params: Sequence[str], *, kills: int, pauses: int, seed: int, base: Path,
    log: Callable[[str], None] = lambda s: None, ignore_outputs: frozenset[str] | set[str] = frozenset(),
    timeout_s: float = 3600, min_faults: int | None = None, pool: Path | str | None = None,
    store: str | None = None,
) -> Report:
    cwd = Path.cwd()  # where the user's relative paths point; the runs work in their sandboxes
    flow = flow.resolve()
    clean_dir, faulted_dir = base / "clean", base / "faulted"
    clean_dir.mkdir(parents=True)
    faulted_dir.mkdir(parents=True)
    loaded = load_flow(flow)
    overrides = parse_overrides(params)
    # Before anything runs: a declared sink outside the sandbox is remapped into it, or refused.
    overrides, remapped, has_sinks = keep_inside(
        loaded.flow.steps, CLEAN_ID, resolve(loaded.flow.params, overrides), overrides, clean_dir, cwd, log)
    # And a relative input names the user's file, not one in the (empty) sandbox.
    overrides = anchor_inputs(loaded.flow.steps, CLEAN_ID, resolve(loaded.flow.params, overrides),
                              overrides, clean_dir, cwd, log)
    values = resolve(loaded.flow.params, overrides)
    clean = _Cli(clean_dir, base, pool, CLEAN_ID, store)
    log("clean run ...")
    t0 = time.monotonic()
    proc = clean(*clean.run_args(flow, overrides), check=False)
    clean_s = time.monotonic() - t0
    if proc.returncode == 2:  # refused at submit (say, a need the pool cannot meet): say why
        raise UsageError(proc.stderr.strip().removeprefix("segue: ") or "the clean run was refused")
    clean_state = clean.state().value
    totals = {t.step: float(t.progress_total) for t in clean.store.get_tasks(CLEAN_ID)
              if t.progress_total}
    log(f"clean run {clean_state} in {clean_s:.1f}s")
    a = snapshot(clean_dir, Home.resolve(clean_dir / ".segue", store=store), CLEAN_ID)
    out = escaped(a.sinks, clean_dir, values, "clean")
    if out:  # the faulted run would write the same place: not run, nothing to compare
        return Report(clean_s=clean_s, faulted_s=0.0, clean_state=clean_state, faulted_state="NOT RUN",
                      min_faults=min_faults, has_sinks=True, escaped=out, remapped=remapped)

    faults = plan(seed, kills, pauses)
    cli = _Cli(faulted_dir, base, pool, FAULTED_ID, store)
    log(f"faulted run with {kills} kills and {pauses} pause/resume cycles (seed {seed}) ...")
    deadline = time.monotonic() + timeout_s
    t0 = time.monotonic()
    cli(*cli.run_args(flow, overrides), "--detach")
    report_faults: list[dict[str, Any]] = []
    clock = _Progress(clean_s, t0, totals, FAULTED_ID)
    for f in faults:
        entry: dict[str, Any] = {"kind": f.kind, "at": round(f.at, 3)}
        target = _wait_for(cli, clock, f, deadline)
        if target is None:
            entry.update(landed=False, why=f"the run was {cli.state().value} before it got there")
        else:
            landed, detail = _inject(cli, target, f)
            entry.update(landed=landed, **detail)
            if f.kind == "pause" and landed:
                clock.paused_s += float(detail.get("paused_s", 0.0))
        report_faults.append(entry)
        log(f"  {f.kind:<10} at {100 * f.at:4.0f}%: {'landed' if entry['landed'] else 'missed'} "
            f"{ {k: v for k, v in entry.items() if k not in ('kind', 'at', 'landed')} }")
    while time.monotonic() < deadline:
        state = _keep_going(cli)
        if state in (RunState.SUCCEEDED, RunState.CANCELLED):
            break
        time.sleep(0.05)
    faulted_s = time.monotonic() - t0
    faulted_state = cli.state().value
    log(f"faulted run {faulted_state} in {faulted_s:.1f}s")

    b = snapshot(faulted_dir, Home.resolve(faulted_dir / ".segue", store=store), FAULTED_ID)
    rep = Report(clean_s=clean_s, faulted_s=faulted_s, faults=report_faults,
                 diff=compare(a, b, ignore_outputs=ignore_outputs), clean_state=clean_state,
                 faulted_state=faulted_state, paused_s=clock.paused_s, min_faults=min_faults,
                 has_sinks=has_sinks or bool(a.sinks or b.sinks),
                 escaped=escaped(b.sinks, faulted_dir, values, "faulted"), remapped=remapped)
    stats: dict[str, float] = getattr(cli.store, "get_stats", lambda r: {})(FAULTED_ID)
    rep.work_redone_s = float(stats.get("work_redone_s", 0.0))
    return rep


@dataclass
class _Progress:
    """How far the faulted run is, as a fraction of the clean run's work.

    If steps of the clean run reported progress totals, the fraction is the
    faulted run's progress over those totals (a step counts fully once it
    succeeded): the moment does not depend on the machine's speed. Otherwise
    it is the active time over the clean run's duration.
    """

    clean_s: float
    t0: float
    totals: dict[str, float]  # step -> progress total reported in the clean run
    run_id: str = FAULTED_ID
    paused_s: float = 0.0
    first_lease: dict[tuple[str, int], float] = field(default_factory=dict)

    def working(self, store: Any, t: Any) -> bool:
        """Whether the attempt is past its start-up: it committed a checkpoint or heartbeat.

        A worker killed while it still imports would prove little; one that
        checkpoints or renews its lease runs the step's code (observed, not
        assumed from a delay).
        """
        first = self.first_lease.setdefault((t.step, t.epoch), t.lease_until or 0.0)
        if (t.lease_until or 0.0) > first:
            return True
        return any(c.epoch == t.epoch for c in store.list_checkpoints(self.run_id, t.step))

    def fraction(self, tasks: list[Any]) -> float:
        if not self.totals:
            return (time.monotonic() - self.t0 - self.paused_s) / max(self.clean_s, 1e-3)
        done = 0.0
        for t in tasks:
            total = self.totals.get(t.step)
            if total is None:
                continue
            done += total if t.state == TaskState.SUCCEEDED else min(t.progress_done or 0.0, total)
        return done / sum(self.totals.values())


def _keep_going(cli: _Cli) -> RunState:
    """Resume the run as an operator would when nothing drives it; returns its state."""
    run = cli.store.get_run(cli.run_id)
    if run.state in (RunState.FAILED, RunState.PAUSED) or (
        run.state in (RunState.RUNNING, RunState.PAUSING) and not controller_alive(run)
    ):
        # Kills count against retries; an operator would resume.
        cli("resume", cli.run_id, "--detach", check=False)
        wait_dead_or_driven(cli)
    return cli.state()


def wait_dead_or_driven(cli: _Cli, timeout_s: float = 30.0) -> None:
    """After a resume: wait until a controller holds the run (or it rests), so we do not resume twice."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        run = cli.store.get_run(cli.run_id)
        if controller_alive(run) or run.state in (RunState.SUCCEEDED, RunState.CANCELLED):
            return
        time.sleep(0.02)


def _wait_for(cli: _Cli, clock: _Progress, f: Fault, deadline: float) -> dict[str, Any] | None:
    """Wait until the run reached the fault's point and has a target; None if it ended first."""
    while time.monotonic() < deadline:
        state = _keep_going(cli)
        if state in (RunState.SUCCEEDED, RunState.CANCELLED):
            return None
        run = cli.store.get_run(cli.run_id)
        tasks = cli.store.get_tasks(cli.run_id)
        if clock.fraction(tasks) >= f.at and run.state == RunState.RUNNING and controller_alive(run):
            if f.kind != "worker":
                return {"controller": run.controller_pid}
            running = [t for t in tasks if t.state == TaskState.RUNNING and t.pid and pid_alive(t.pid)
                       and clock.working(cli.store, t)]
            if running:
                return {"controller": run.controller_pid, "step": running[0].step,
                        "worker": running[0].pid}
        time.sleep(0.005)
    return None


def _start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _kill(pid: int) -> tuple[bool, str]:
    """SIGKILL ``pid``; landed if it was alive right before and is dead after."""
    born = _start_time(pid)
    if born is None or not pid_alive(pid):
        return False, "the process was already gone"
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False, "the process was already gone"
    if not wait_dead(pid, 10.0) and _start_time(pid) == born:
        return False, "the process survived SIGKILL for 10s"
    return True, ""


def _inject(cli: _Cli, target: dict[str, Any], f: Fault) -> tuple[bool, dict[str, Any]]:
    if f.kind in ("worker", "controller"):
        pid = target["worker"] if f.kind == "worker" else target["controller"]
        landed, why = _kill(pid)
        detail: dict[str, Any] = {"pid": pid}
        if f.kind == "worker":
            detail["step"] = target["step"]
        if not landed:
            detail["why"] = why
        return landed, detail
    t = time.monotonic()
    proc = cli("pause", cli.run_id, "--wait", "--timeout", "120", check=False)
    paused = time.monotonic() - t
    if proc.returncode != 0:
        return False, {"why": (proc.stderr.strip() or proc.stdout.strip()).removeprefix("segue: ")}
    return True, {"paused_s": round(paused, 3)}  # _keep_going resumes it
