"""What the controller concludes about attempts it did not see end.

``reclaim_orphan``: an attempt left RUNNING by a previous controller.
``describe_exit``: what an attempt's exit means, and whether a retry can help.
"""

from __future__ import annotations

import json
import os
import signal
import time

from ..home import Home
from ..states import Actor, TaskState
from ..store.base import Store, TaskRecord
from .procs import pid_alive, wait_dead
from .worker import exit_report_path


def reclaim_orphan(
    store: Store, run_id: str, t: TaskRecord, *, prev_host: str | None, host: str, ttl_s: float,
    actor: Actor,
) -> None:
    """Make an orphaned RUNNING task PENDING once its attempt can no longer commit.

    A live lease on this host with a live pid: that process is ours to stop
    now. A pid that was never recorded on a local attempt: the process died
    with its controller (PDEATHSIG) or never started. An expired lease:
    presumed lost (a frozen or unreachable machine); we do not touch it,
    and the epoch bump of the next attempt fences it. A live lease
    elsewhere: wait for it to expire.
    """
    deadline = time.time() + ttl_s * 2
    while True:
        cur = store.get_task(run_id, t.step)
        if cur.state != TaskState.RUNNING or cur.epoch != t.epoch:
            return
        live = cur.lease_until is not None and cur.lease_until > time.time()
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
        if time.time() > deadline:
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
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process was killed by {name}", True
    return f"worker process exited with code {code}", True
