"""A busy metadata store: how long a write waits for a lock, and who holds it.

A SQLite write waits ``busy_timeout_s()`` for the write lock, then fails with
:class:`~segue.errors.StoreBusyError`, one line naming the holder where the
kernel says (``/proc/locks``, Linux), instead of a raw ``database is locked``.
A PostgreSQL write waits as long for row locks only where the variable is set
(``lock_timeout``; else until the server ends a frozen holder's transaction).
Nothing here writes: the refused transaction never began, or rolled back.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ..errors import StoreBusyError, UsageError
from ..hostname import this_host
from .sqlite_rows import BUSY_TIMEOUT_S

BUSY_TIMEOUT_ENV = "SEGUE_STORE_BUSY_TIMEOUT_S"

# In WAL mode a writer holds a POSIX lock on this byte of the -shm file
# (WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK in SQLite's wal.c).
_WAL_WRITE_LOCK_BYTE = 120


def busy_timeout_s() -> float:
    """Seconds a write waits for the write lock: ``$SEGUE_STORE_BUSY_TIMEOUT_S``, else 30."""
    raw = os.environ.get(BUSY_TIMEOUT_ENV, "").strip()
    if not raw:
        return BUSY_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise UsageError(f"{BUSY_TIMEOUT_ENV}={raw!r} is not a number of seconds >= 0; "
                             f"unset it or give one, e.g. {BUSY_TIMEOUT_ENV}=30")
    return value


def is_busy(exc: BaseException) -> bool:
    """SQLITE_BUSY: another connection holds the lock (the busy timeout ran out)."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF == sqlite3.SQLITE_BUSY
    return "database is locked" in str(exc)


def write_lock_holder(db: Path) -> int | None:
    """The pid holding the WAL write lock of ``db``, if the kernel says (Linux only)."""
    try:
        st = os.stat(f"{db}-shm")
        with open("/proc/locks") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        # "1: POSIX  ADVISORY  WRITE 24143 fe:00:2318453 120 120"
        c = line.split()
        if len(c) >= 8 and c[1] == "POSIX" and c[3] == "WRITE" and c[5] == want \
                and c[6] == str(_WAL_WRITE_LOCK_BYTE) and c[4].isdigit() and int(c[4]) > 0:
            return int(c[4])
    return None


def _who(conn: sqlite3.Connection, pid: int | None) -> str:
    if pid is None:
        return "another process"
    try:  # WAL: a read goes on while another connection holds the write lock
        row = conn.execute("SELECT run_id FROM runs WHERE controller_pid = ? AND controller_host = ?"
                           " ORDER BY updated_at DESC LIMIT 1", (pid, this_host())).fetchone()
    except sqlite3.Error:
        row = None
    if row is not None:
        return f"pid {pid} (the controller of run {row[0]})"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = " ".join(f.read().replace(b"\0", b" ").decode(errors="replace").split())
    except OSError:
        cmd = ""
    return f"pid {pid} ({cmd[:50]}{'...' if len(cmd) > 50 else ''})" if cmd else f"pid {pid}"


def busy_error(db: Path, conn: sqlite3.Connection, waited_s: float) -> StoreBusyError:
    """The one line for a write refused after ``waited_s`` behind another writer."""
    who = _who(conn, write_lock_holder(db))
    return StoreBusyError(
        f"the metadata store {db} is busy: {who} has held its write lock for over {waited_s:g}s; "
        f"nothing was written; retry when it lets go, or stop it if it is stuck "
        f"(${BUSY_TIMEOUT_ENV} sets how long segue waits)"
    )
