"""An attempt that dies with its controller is accounted as a killed one (docs/accounting.md).

A real detached controller is SIGKILLed while its worker waits at a gate (its
checkpoint at i=100 committed, heartbeats after it recorded); the worker dies
with it (PR_SET_PDEATHSIG). Until then the attempt vanished from the
accounting once its lease lapsed, and `segue resume` charged neither it, its
redone work nor the resume. Every bound comes from what the store recorded
(event times, the task's last heartbeat), never from sleeps.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue._procs import pid_alive
from segue.client.local import LocalClient
from segue.home import Home

GATED = str(FLOWS / "gatedgpu.py")
EPS = 2e-3  # status rounds seconds to 3 decimals
UI = all(importlib.util.find_spec(m) for m in ("fastapi", "jinja2"))  # the server's extras


def _work(segue: Segue, run: str) -> dict[str, Any]:
    return segue.step(run, "work")


def _last_heartbeat(segue: Segue, run: str) -> float:
    """The task row's last write while RUNNING: its worker's last heartbeat (real SQLite)."""
    with sqlite3.connect(f"file:{segue.home / 'segue.db'}?mode=ro", uri=True) as db:
        return float(db.execute("SELECT updated_at FROM tasks WHERE run_id = ? AND step = 'work'",
                                (run,)).fetchone()[0])


def _at_gate_with_a_heartbeat_after_its_checkpoint(segue: Segue, run: str, attempt: int) -> dict[str, Any] | None:
    s = _work(segue, run)
    ck = s["last_checkpoint"]
    ok = (s["state"] == "RUNNING" and s["attempts"] == attempt and s["pid"] and ck
          and ck["position"] == {"i": 100} and _last_heartbeat(segue, run) > ck["time"] + 0.1)
    return s if ok else None


def _attempt_box(page: Any, attempt: int) -> Any:
    return next(b for b in page.gantt.boxes if b.title.startswith(f"work attempt {attempt} "))


def _starts(segue: Segue, run: str) -> dict[int, float]:
    return {e["data"]["epoch"]: e["time"] for e in segue.events(run)
            if e["kind"] == "task" and e["to_state"] == "RUNNING" and "epoch" in e["data"]}


def test_attempt_lost_with_its_controller_is_charged_to_its_last_heartbeat(
        segue: Segue, tmp_path: Path, _test_pool: Path) -> None:
    assert segue("pool", "set", "--gpus", "1", "--gpu-mem", "80GB", "--cpus", "8").returncode == 0
    gate = tmp_path / "gate"
    segue("run", GATED, "--detach", "--run-id", "lost1", "-p", f"gate={gate}", check=True)
    first = wait_for(lambda: _at_gate_with_a_heartbeat_after_its_checkpoint(segue, "lost1", 1), 120,
                     "attempt 1 at the gate, heartbeating after its checkpoint")
    ctl = segue.status("lost1")["controller"]["pid"]
    os.kill(ctl, signal.SIGKILL)
    wait_for(lambda: not pid_alive(first["pid"]), 30, "the worker to die with its controller")
    dead = wait_for(lambda: (d := segue.status("lost1"))["problem"] and d, 30, "status to see no controller")
    assert dead["problem"].startswith("no controller:"), dead["problem"]
    step = next(s for s in dead["steps"] if s["name"] == "work")
    beat, ck1 = _last_heartbeat(segue, "lost1"), step["last_checkpoint"]["time"]
    start1 = _starts(segue, "lost1")[1]
    # Nothing drives the run: its attempt is counted to its last heartbeat, not to now,
    # and not dropped once its lease lapses.
    acct = dead["accounting"]
    assert acct["attempt_seconds"] == pytest.approx(beat - start1, abs=EPS)
    assert acct["device_seconds"] == pytest.approx(beat - start1, abs=EPS)
    assert step["last_heartbeat"] == beat

    if UI:  # the UI draws it to its last heartbeat too, and the run list stops there
        from segue.server.auth import Principal, Role
        from segue.server.ui import listing, views
        from segue.server.ui.charts import hms

        client = LocalClient(Home.resolve(segue.home), pool=_test_pool)
        viewer = Principal("v", Role.VIEWER)
        box = _attempt_box(views.run_page(client, viewer, "lost1"), 1)
        assert f"to {hms(beat)} (its last heartbeat) ({beat - start1:.1f}s)" in box.title, box.title
        row = next(r for r in listing.listing(client, state=None, flow=None, page=1).rows
                   if r.run_id == "lost1")
        # To the run's last sign of life (its controller's last lease renewal, or the
        # heartbeat), not to now.
        with sqlite3.connect(f"file:{segue.home / 'segue.db'}?mode=ro", uri=True) as db:
            renewed, started = db.execute("SELECT r.updated_at, t.started_at FROM runs r JOIN tasks t"
                                          " USING (run_id) WHERE run_id = 'lost1'").fetchone()
        assert row.duration == pytest.approx(max(renewed, beat) - started, abs=1e-6)

    assert segue("resume", "lost1", "--detach").returncode == 0
    wait_for(lambda: _at_gate_with_a_heartbeat_after_its_checkpoint(segue, "lost1", 2), 120,
             "attempt 2 to resume at the gate")
    gate.touch()
    segue.wait_state("lost1", {"SUCCEEDED"}, 120)

    events = segue.events("lost1")
    charged = [e for e in events if e["kind"] == "accounting" and e["step"] == "work"]
    assert len(charged) == 1, charged
    d = charged[0]["data"]
    assert d["epoch"] == 1 and d["start"] == start1 and d["end"] == beat
    assert d["held_s"] == pytest.approx(beat - start1, abs=EPS)
    assert d["lost_s"] == pytest.approx(beat - ck1, abs=EPS)  # after its last checkpoint

    acct = segue.status("lost1")["accounting"]
    assert acct["resumes"] == 1  # attempt 2 continued from attempt 1's checkpoint
    assert acct["work_redone_seconds"] == pytest.approx(beat - ck1, abs=EPS)  # attempt 2 lost nothing
    assert acct["device_seconds_redone"] == pytest.approx(beat - ck1, abs=EPS)
    assert acct["device_seconds"] == pytest.approx(acct["device_seconds_useful"] + acct["device_seconds_redone"],
                                                   abs=EPS)
    # Both attempts are in the total: the lost one from its start to its last heartbeat.
    start2 = _starts(segue, "lost1")[2]
    done2 = max(e["time"] for e in events if e["kind"] == "task" and e["to_state"] == "SUCCEEDED")
    assert acct["attempt_seconds"] >= (beat - start1) + (done2 - start2) - EPS
    assert 0 < acct["seconds_saved_by_resume"] <= ck1 - start1 + EPS  # what its checkpoint covered

    if not UI:
        return
    # Drawn to its last heartbeat: the gap "controller lost" starts there, not at the reclaim.
    page = views.run_page(client, viewer, "lost1")
    box = _attempt_box(page, 1)
    assert box.cls == "st-PENDING"
    assert f"to {hms(beat)} (its last heartbeat) ({beat - start1:.1f}s), PENDING" in box.title, box.title
    gap = next(g for g in page.gaps if g[0] == "work" and "controller lost" in g[1])
    assert gap[2] == beat
