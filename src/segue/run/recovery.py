"""What the controller concludes about attempts it did not see end.

``reclaim_orphan``: an attempt left RUNNING by a previous controller.
``describe_exit``: what an attempt's exit means, and whether a retry can help.
``lost_controller``: a run that looks alive but that nothing drives.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ..home import Home
from ..states import RunState, TaskState
from ..store.base import RunRecord, Store, TaskRecord
from .exits import exit_report_path
from .outage import EXIT_DISK_FULL, disk_full_line
from .procs import controller_alive, pid_alive, wait_dead


def reclaim_orphan(
    store: Store, run_id: str, t: TaskRecord, *, prev_host: str | None, host: str, ttl_s: float,
    actor: str,
) -> None:
    """Make an orphaned RUNNING task PENDING once its attempt can no longer commit.

    A live lease on this host with a live pid: that process is ours to stop
    now. A pid that was never recorded on a local attempt: the process died
    with its controller (PDEATHSIG) or never started. An expired lease:
    presumed lost (a frozen or unreachable machine); we do not touch it,
    and the epoch bump of the next attempt fences it. A live lease
    elsewhere: wait for it to expire.
    """
    # Leases are judged on the store's clock (virtual in tests, the database's on
    # PostgreSQL), never on this host's.
    deadline = store.now() + ttl_s * 2
    while True:
        cur = store.get_task(run_id, t.step)
        if cur.state != TaskState.RUNNING or cur.epoch != t.epoch:
            return
        live = cur.lease_until is not None and cur.lease_until > store.now()
        if not live:
            break
        local = (cur.host or prev_host) == host
        if local and not pid_alive(cur.pid):
            break
        if local and cur.pid:
            try:
                os.kill(cur.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            if wait_dead(cur.pid, 1.0):
                break
        if store.now() > deadline:
            break
        time.sleep(0.05)
    store.transition_task(
        run_id, t.step, TaskState.PENDING, actor=actor, epoch=t.epoch,
        reason="attempt lost with its controller; it does not count as a failure",
    )


def describe_exit(home: Home, run_id: str, step: str, epoch: int, code: int, *,
                  lease_lost: bool) -> tuple[str, bool]:
    """What went wrong, and whether a retry can help."""
    if lease_lost:
        return f"attempt epoch {epoch} stopped heartbeating (lease expired); killed", True
    report = exit_report_path(home, run_id, step, epoch)
    if report.exists():
        try:
            doc = json.loads(report.read_text())
            return str(doc["error"]), bool(doc.get("retryable", True))
        except (ValueError, KeyError, OSError):
            pass
    if code == EXIT_DISK_FULL:  # it could not even write its exit report
        return disk_full_line(f"step {step}'s checkpoint or output", home.root, run_id), False
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process was killed by {name}", True
    return f"worker process exited with code {code}", True


def lost_controller(run: RunRecord, at: float | None = None) -> str | None:
    """One line if nothing drives a RUNNING (or PAUSING) run any more, else None.

    A controller that died without a word (SIGKILL, a disk so full that not even
    a pause could be recorded) leaves the run RUNNING; status must say so rather
    than show a run that looks alive.
    """
    if run.state not in (RunState.RUNNING, RunState.PAUSING) or controller_alive(run, at):
        return None
    who = (f"pid {run.controller_pid} on {run.controller_host}" if run.controller_pid
           else "none recorded")
    return (f"no controller: the run is {run.state.value} but its controller ({who}) is gone "
            f"and recorded no outcome; `segue resume {run.run_id}` continues from the last "
            "checkpoints")
