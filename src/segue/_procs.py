"""Local process facts the controller relies on: is a pid alive, wait for it to die.

A process that was killed but not yet reaped (a zombie) counts as dead: it
holds no resources and will never commit anything.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from .hostname import this_host


def pid_alive(pid: int | None) -> bool:
    """Whether a local process exists and is not a zombie (killed, not yet reaped).

    Threads draw their ids from the same space as processes, and ``kill(tid, 0)``
    succeeds on a thread: with many short-lived threads the ids wrap around
    (``pid_max`` is 32768 by default) and a dead process's pid can come back as
    some other process's thread within seconds. Only a thread-group leader
    (``Tgid`` equal to the pid) is a process.
    """
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
    except FileNotFoundError:
        return False  # it exited between the two looks
    except OSError:
        return True  # no /proc to ask: trust the signal
    state, tgid = fields.get(b"State", b"").split(), fields.get(b"Tgid", b"").strip()
    if tgid and int(tgid) != pid:
        return False  # a thread of another process that reused the id
    return not state or state[0] not in (b"Z", b"X")


def die_with_parent(parent_pid: int, code: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``), so
    no orphan keeps computing; exit with ``code`` at once if the parent already died
    before that took effect."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(code)


def wait_dead(pid: int | None, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for a local process to die; True if it did."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def controller_alive(run: Any, at: float | None = None) -> bool:
    """Whether a run's controller is alive, as far as this host can know.

    The lease is what a remote host has to go by. A controller on this host
    whose pid is gone is dead now, whatever its lease says: waiting for the
    lease to expire would only delay status and resume (``run`` is a RunRecord).
    """
    if not run.controller_alive(at):
        return False
    if run.controller_host == this_host():
        return pid_alive(run.controller_pid)
    return True
