"""Whatever ends `segue verify`, its processes and its sandbox go with it.

``segue verify`` starts detached controllers (their own sessions, so they
outlive the command that started them) and workers, all in a sandbox
directory. Every one of them inherits ``SEGUE_VERIFY_SANDBOX=<sandbox>``, the
mark this module looks for in ``/proc/PID/environ``.

A verify that ends normally, or by SIGTERM or SIGINT, calls :func:`reap`
itself. Against SIGKILL, which runs no handler, a small watchdog process
(``python -m segue.verify.reaper SANDBOX``, in its own session) holds the
read end of a pipe whose write end only the verify process has: when the
verify dies in any way the kernel closes it, the watchdog reads EOF and reaps.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

MARK = "SEGUE_VERIFY_SANDBOX"


def marked_pids(sandbox: str) -> list[int]:
    """Processes of this user whose environment carries the sandbox's mark."""
    want = f"{MARK}={sandbox}".encode()
    me = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or not ours
            continue
        if want in env:
            found.append(int(entry))
    return found


def reap(sandbox: str | Path, *, remove: bool, timeout_s: float = 30.0) -> int:
    """SIGKILL every marked process until none is left, then remove the sandbox.

    Scans repeat because a controller may start a worker between two scans.
    Returns how many processes were killed.
    """
    sandbox = str(sandbox)
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [p for p in marked_pids(sandbox) if _alive(p)]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    if remove:
        shutil.rmtree(sandbox, ignore_errors=True)
    return len(killed)


def _alive(pid: int) -> bool:
    from .._procs import pid_alive

    return pid_alive(pid)


class Watchdog:
    """The SIGKILL-proof half: a process that reaps once this one is gone."""

    def __init__(self, sandbox: Path, *, remove: bool) -> None:
        self.sandbox = sandbox
        read_end, self._write_end = os.pipe()
        cmd = [sys.executable, "-m", "segue.verify.reaper", str(sandbox)]
        if not remove:
            cmd.append("--keep")
        env = {k: v for k, v in os.environ.items() if k != MARK}  # it must not reap itself
        # Its own session: a ctrl-c in the terminal reaches verify, not the watchdog.
        self.proc = subprocess.Popen(cmd, stdin=read_end, env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(read_end)
        # Only this process holds the write end: children must not inherit it,
        # or the watchdog would wait for them too.
        os.set_inheritable(self._write_end, False)

    def close(self) -> None:
        """Let the watchdog reap now (verify finished and reaped by itself too)."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="segue-verify-reaper")
    p.add_argument("sandbox")
    p.add_argument("--keep", action="store_true", help="kill the processes but keep the files")
    a = p.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):  # EOF: the verify process is gone (or done)
        pass
    reap(a.sandbox, remove=not a.keep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
