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

from .._procs import controller_alive, pid_alive, wait_dead
from ..executor.exits import exit_report_path
from ..home import Home
from ..hostname import this_host
from ..states import RunState, TaskState
from ..store.base import RunRecord, Store, TaskRecord
from .outage import EXIT_DISK_FULL, disk_full_line


def reclaim_orphan(
    store: Store, run_id: str, t: TaskRecord, *, prev_host: str | None, host: str, ttl_s: float,
    actor: str,
) -> TaskRecord | None:
    """Make an orphaned RUNNING task PENDING once its attempt can no longer commit.

    Returns the task as last seen RUNNING (its ``updated_at`` is the attempt's last
    heartbeat), for the accounting of the lost attempt; None if another actor moved it.

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
            return None
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
    # Read again: a heartbeat may have landed while we stopped its process.
    last = store.get_task(run_id, t.step)
    store.transition_task(
        run_id, t.step, TaskState.PENDING, actor=actor, epoch=t.epoch,
        reason="attempt lost with its controller; it does not count as a failure",
    )
    return last


def attempt_start(store: Store, run_id: str, step: str, epoch: int) -> float | None:
    """When attempt ``epoch`` of ``step`` started: its ``-> RUNNING`` event."""
    for e in store.list_events(run_id, kinds=("task",)):
        if e.step == step and e.to_state == TaskState.RUNNING.value and (e.data or {}).get("epoch") == epoch:
            return e.time
    return None


def last_alive(t: TaskRecord) -> float:
    """The last sign of life of a RUNNING task's attempt: its last heartbeat (or progress
    report, the task row's last write), never later than its lease."""
    return min(t.updated_at, t.lease_until) if t.lease_until is not None else t.updated_at


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


def lost_controller(run: RunRecord, at: float | None = None, *,
                    store_dir: str | os.PathLike[str] | None = None) -> str | None:
    """One line if nothing drives a RUNNING (or PAUSING) run any more, else None.

    A controller that died without a word (SIGKILL, a disk so full that not even
    a pause could be recorded) leaves the run RUNNING; status must say so rather
    than show a run that looks alive. A controller whose lease lapsed but whose
    pid lives on this host is not gone: it waits for a store it cannot write
    (``store_dir``: where the store's files are, to say how much room is left).
    """
    if run.state not in (RunState.RUNNING, RunState.PAUSING) or controller_alive(run, at):
        return None
    if controller_waiting(run):
        since = time.strftime("%H:%M:%S", time.localtime(run.controller_lease_until or 0))
        free = free_bytes(store_dir)
        room = "" if free is None else f" (the filesystem of {store_dir} has {free:,} bytes free)"
        return (f"controller waiting: its controller (pid {run.controller_pid} on {run.controller_host}) "
                f"is alive but could not renew its lease, which lapsed at {since}: it is waiting for "
                f"the store to take writes again{room}; free space there and it carries on by "
                f"itself; no `segue resume` is needed while pid {run.controller_pid} lives")
    who = (f"pid {run.controller_pid} on {run.controller_host}" if run.controller_pid
           else "none recorded")
    return (f"no controller: the run is {run.state.value} but its controller ({who}) is gone "
            f"and recorded no outcome; `segue resume {run.run_id}` continues from the last "
            "checkpoints")


def controller_waiting(run: RunRecord) -> bool:
    """A controller of this host whose lease lapsed but whose process lives: it retries
    a store it cannot write (or it is stopped); it is not gone."""
    return bool(run.controller_pid) and run.controller_host == this_host() and pid_alive(run.controller_pid)


def free_bytes(path: str | os.PathLike[str] | None) -> int | None:
    """Bytes an unprivileged writer can still use on the filesystem of ``path``."""
    if path is None:
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
