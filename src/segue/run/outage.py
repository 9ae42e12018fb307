"""A full disk (or an unwritable metadata store), as the controller and the worker see it.

Neither process may die of it without a trace: the worker exits with
:data:`EXIT_DISK_FULL` (an exit code needs no disk, unlike its exit report),
and the controller keeps retrying the store until it can record why the run
paused (see ``Controller._ride_out_outage``).
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from ..errors import StoreBusyError

EXIT_DISK_FULL = 6
"""Worker exit code: a write failed for lack of space; parking, not failing, is right."""

# SQLite primary result codes (the low byte of an extended code) that mean
# "cannot write now", not "this statement is wrong".
_SQLITE_UNWRITABLE = {
    sqlite3.SQLITE_FULL,
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_BUSY,
    sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_CANTOPEN,
}


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        return (code is not None and code & 0xFF == sqlite3.SQLITE_FULL) or (
            "database or disk is full" in str(exc)
        )
    return False


def store_unwritable(exc: BaseException) -> bool:
    """True for failures a later retry of the same store write can get past."""
    if is_disk_full(exc) or isinstance(exc, StoreBusyError):  # the store's own busy line
        return True
    if isinstance(exc, OSError) and exc.errno == errno.EIO:
        return True
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in _SQLITE_UNWRITABLE
        msg = str(exc)
        return "disk I/O error" in msg or "database is locked" in msg
    return False


def mount_point(path: str | Path) -> Path:
    """The mount point of the filesystem holding ``path`` (or its nearest existing parent)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    dev = p.stat().st_dev
    while p != p.parent and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def disk_full_line(what: str, where: str | Path, run_id: str) -> str:
    """One line for the operator: what could not be written, where to free space, what next."""
    try:
        mount: str | Path = mount_point(where)
    except OSError:
        mount = where
    return (f"disk full writing {what}; free space under {mount} (old runs' checkpoints: "
            f"`segue ckpt prune`), then `segue resume {run_id}`; committed checkpoints are intact")


def describe_store_failure(exc: BaseException, db: str | Path, run_id: str) -> str:
    if is_disk_full(exc):
        return disk_full_line(f"the metadata store {db}", db, run_id)
    return (f"the metadata store {db} cannot be written ({type(exc).__name__}: {exc}); "
            f"fix that, then `segue resume {run_id}`")
