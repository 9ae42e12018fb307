"""`segue verify`: run a flow cleanly and under seeded faults, then compare.

Each run gets its own sandbox directory (its working directory and its segue
home), so relative sink paths of the two runs never meet. The faulted run is
driven as an operator would: detached controllers, SIGKILLs of workers and
controllers at seeded random moments, pause/resume cycles, and resumes after
each crash. The moments are spread over the clean run's duration.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..home import Home
from ..run.procs import pid_alive, wait_dead
from .compare import Diff, compare, snapshot

RUN_ID = "verify"


@dataclass
class Fault:
    at_s: float
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

    @property
    def ok(self) -> bool:
        return self.diff.identical and self.clean_state == self.faulted_state == "SUCCEEDED"

    def to_json(self) -> dict[str, Any]:
        d = self.diff
        counts: dict[str, int] = {}
        for f in self.faults:
            if f["done"]:
                counts[f["kind"]] = counts.get(f["kind"], 0) + 1
        return {
            "ok": self.ok,
            "clean_state": self.clean_state,
            "faulted_state": self.faulted_state,
            "faults_injected": counts,
            "records_compared": d.records,
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

    paused_s: float = 0.0


def plan(seed: int, kills: int, pauses: int, duration_s: float, controller_share: float = 0.25) -> list[Fault]:
    """The seeded schedule of faults over [5%, 90%] of the clean run's duration."""
    rnd = random.Random(seed)
    faults = []
    for _ in range(kills):
        kind = "controller" if rnd.random() < controller_share else "worker"
        faults.append(Fault(rnd.uniform(0.05, 0.9) * duration_s, kind))
    for _ in range(pauses):
        faults.append(Fault(rnd.uniform(0.05, 0.9) * duration_s, "pause"))
    return sorted(faults, key=lambda f: f.at_s)


class _Cli:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.env = {**os.environ, "SEGUE_HOME": str(workdir / ".segue"), "PYTHONUNBUFFERED": "1"}

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "segue", *args], cwd=self.workdir, env=self.env,
                              capture_output=True, text=True)
        if check and proc.returncode not in (0, 3):
            raise RuntimeError(f"segue {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def status(self) -> dict[str, Any]:
        return json.loads(self("status", RUN_ID, "--json").stdout)


def _run_args(flow: Path, params: Sequence[str]) -> list[str]:
    out = ["run", str(flow), "--run-id", RUN_ID]
    for p in params:
        out += ["--param", p]
    return out


def run_verify(
    flow: Path, params: Sequence[str], *, kills: int, pauses: int, seed: int, base: Path,
    log: Callable[[str], None] = lambda s: None, ignore_outputs: frozenset[str] | set[str] = frozenset(),
    timeout_s: float = 3600,
) -> Report:
    flow = flow.resolve()
    clean_dir, faulted_dir = base / "clean", base / "faulted"
    clean_dir.mkdir(parents=True)
    faulted_dir.mkdir(parents=True)
    clean = _Cli(clean_dir)
    log("clean run ...")
    t0 = time.monotonic()
    clean(*_run_args(flow, params), check=False)
    clean_s = time.monotonic() - t0
    clean_state = clean.status()["state"]
    log(f"clean run {clean_state} in {clean_s:.1f}s")

    faults = plan(seed, kills, pauses, clean_s)
    cli = _Cli(faulted_dir)
    log(f"faulted run with {kills} kills and {pauses} pause/resume cycles (seed {seed}) ...")
    t0 = time.monotonic()
    cli(*_run_args(flow, params), "--detach")
    report_faults: list[dict[str, Any]] = []
    paused_s = 0.0
    for f in faults:
        while time.monotonic() - t0 - paused_s < f.at_s:
            time.sleep(0.01)
        # Wait for a target (a worker that is running, a live controller) or the end.
        while True:
            doc = cli.status()
            if doc["state"] in ("SUCCEEDED", "CANCELLED") or _has_target(doc, f.kind):
                break
            if doc["state"] in ("FAILED", "PAUSED") or (
                doc["state"] in ("RUNNING", "PAUSING") and not doc["controller"]["alive"]
            ):
                cli("resume", RUN_ID, "--detach", check=False)
                time.sleep(0.2)
            time.sleep(0.01)
        if doc["state"] in ("SUCCEEDED", "CANCELLED"):
            report_faults.append({"kind": f.kind, "at_s": f.at_s, "done": False, "why": "run already ended"})
            continue
        done, detail = _inject(cli, doc, f)
        if f.kind == "pause" and done:
            paused_s += float(detail.get("paused_s", 0.0))
        report_faults.append({"kind": f.kind, "at_s": round(f.at_s, 3), "done": done, **detail})
        log(f"  {f.kind:<10} at {f.at_s:6.2f}s: {'injected' if done else 'skipped'} {detail}")
    deadline = time.monotonic() + timeout_s
    while True:
        doc = cli.status()
        if doc["state"] in ("SUCCEEDED", "CANCELLED"):
            break
        if doc["state"] in ("FAILED", "PAUSED") or (
            doc["state"] in ("RUNNING", "PAUSING") and not doc["controller"]["alive"]
        ):
            # Kills count against retries; an operator would resume.
            cli("resume", RUN_ID, "--detach", check=False)
            time.sleep(0.2)
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
    faulted_s = time.monotonic() - t0
    faulted_state = cli.status()["state"]
    log(f"faulted run {faulted_state} in {faulted_s:.1f}s")

    a = snapshot(clean_dir, Home.resolve(clean_dir / ".segue"), RUN_ID)
    b = snapshot(faulted_dir, Home.resolve(faulted_dir / ".segue"), RUN_ID)
    rep = Report(clean_s=clean_s, faulted_s=faulted_s, faults=report_faults,
                 diff=compare(a, b, ignore_outputs=ignore_outputs), clean_state=clean_state,
                 faulted_state=faulted_state, paused_s=paused_s)
    rep.work_redone_s = float(cli.status().get("accounting", {}).get("work_redone_seconds", 0.0))
    return rep


def _has_target(doc: dict[str, Any], kind: str) -> bool:
    if doc["state"] != "RUNNING" or not doc["controller"]["alive"]:
        return False
    if kind == "worker":
        return any(s["state"] == "RUNNING" and s["pid"] for s in doc["steps"])
    return True


def _inject(cli: _Cli, doc: dict[str, Any], f: Fault) -> tuple[bool, dict[str, Any]]:
    if f.kind == "worker":
        running = [s for s in doc["steps"] if s["state"] == "RUNNING" and s["pid"]]
        if not running:
            return False, {"why": "no worker running"}
        s = running[0]
        try:
            os.kill(s["pid"], signal.SIGKILL)
        except ProcessLookupError:
            return False, {"why": "worker already gone"}
        return True, {"step": s["name"], "pid": s["pid"]}
    if f.kind == "controller":
        pid = doc["controller"]["pid"]
        if not doc["controller"]["alive"] or not pid_alive(pid):
            return False, {"why": "no controller alive"}
        os.kill(pid, signal.SIGKILL)
        wait_dead(pid, 5)
        cli("resume", RUN_ID, "--detach", check=False)
        return True, {"pid": pid}
    # pause / resume cycle
    t = time.monotonic()
    proc = cli("pause", RUN_ID, "--wait", "--timeout", "120", check=False)
    if proc.returncode != 0:
        return False, {"why": proc.stderr.strip() or proc.stdout.strip()}
    paused = time.monotonic() - t
    cli("resume", RUN_ID, "--detach", check=False)
    return True, {"paused_s": round(paused, 3)}
