"""Row-level helpers of the SQLite store: connections, fetch, update, insert.

Every function here runs inside the caller's transaction and never commits;
the methods of :class:`~segue.store.sqlite.SQLiteStore` own the transactions.
What a write may do and what it changes is decided in
:mod:`segue.store.transitions`, for both backends; rows become records in
:mod:`segue.store.records`.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from ..errors import StoreError, UnknownRunError
from ..states import RunState
from . import records
from .base import Event, NewRun, TaskRecord, now
from .records import EVENT_COLUMNS, EventFields, event_of, event_values, task_record
from .transitions import (
    RUN_COLUMNS,
    TASK_COLUMNS,
    EventDraft,
    Move,
    event_args,
    resolve_changes,
    start_move,
)

BUSY_TIMEOUT_S = 30.0  # how long a writer waits for the lock (and a fresh file's WAL switch)


class PerThreadConnection(ABC):
    """One SQLite connection per thread of each process, opened on first use.

    After fork() a child inherits its parent's thread-local connection; sharing
    an SQLite connection across processes corrupts its locking, so the child
    opens its own and leaves the inherited one alone. Subclasses open and
    configure (``_open``); the metadata store and the host pool share this.
    """

    _local: threading.local

    @abstractmethod
    def _open(self) -> sqlite3.Connection:
        """Open and configure a new connection to this database."""

    def _conn(self) -> sqlite3.Connection:
        local = self._local  # set by each subclass's constructor (also after unpickling)
        conn = getattr(local, "conn", None)
        if conn is None or local.pid != os.getpid():
            conn = self._open()
            local.conn, local.pid = conn, os.getpid()
        return conn

    def close(self) -> None:
        local = self._local
        conn = getattr(local, "conn", None)
        if conn is not None and local.pid == os.getpid():
            conn.close()
        local.conn = None


def configure(conn: sqlite3.Connection) -> None:
    """The pragmas every segue database uses: rows by name, a busy timeout, WAL,
    ``synchronous=FULL`` and foreign keys.

    FULL, not NORMAL: a commit is what records that a checkpoint exists, that an
    output was published or that a device is allocated, and that must survive
    power loss. In WAL mode NORMAL skips the fsync at commit and can lose the last
    transactions on a crash of the machine (not of the process).
    """
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    _set_wal(conn)
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA foreign_keys = ON")


def _set_wal(conn: sqlite3.Connection) -> None:
    """Switch to WAL. The switch needs an exclusive lock; when another process is
    opening the same fresh file at that moment it can fail with 'locked' even
    with a busy timeout, so retry for as long as the timeout allows."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL").fetchone()
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise StoreError(f"cannot switch the metadata store to WAL mode: {e}") from e
            time.sleep(0.01)


# -- helpers: reads and checks inside a transaction ---------------------------------
def _fetch_run(conn: sqlite3.Connection, run_id: str) -> sqlite3.Row:
    row = conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    if row is None:
        raise UnknownRunError(run_id)
    return row


def _fetch_task(conn: sqlite3.Connection, run_id: str, step: str) -> sqlite3.Row:
    row = conn.execute(
        "SELECT * FROM tasks WHERE run_id = ? AND step = ?", (run_id, step)
    ).fetchone()
    if row is None:
        _fetch_run(conn, run_id)  # UnknownRunError if the run is the missing part
        raise StoreError(f"run {run_id!r} has no step {step!r}")
    return row


# -- helpers: writes inside a transaction -------------------------------------------
def _update_task(
    conn: sqlite3.Connection, run_id: str, step: str, changes: dict[str, Any]
) -> None:
    bad = set(changes) - TASK_COLUMNS
    if bad:
        raise ValueError(f"not task columns: {sorted(bad)}")
    cols = ", ".join(f"{c} = ?" for c in changes)
    conn.execute(
        f"UPDATE tasks SET {cols} WHERE run_id = ? AND step = ?",
        (*changes.values(), run_id, step),
    )


def _insert_event(conn: sqlite3.Connection, run_id: str, kind: str,
                  **fields: Unpack[EventFields]) -> Event:
    values = event_values(run_id, kind, **fields)
    cur = conn.execute(f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       values)
    if cur.lastrowid is None:  # pragma: no cover - sqlite always sets it for an INSERT
        raise StoreError("event insert returned no id")
    return event_of(cur.lastrowid, values)


def apply_task_move(conn: sqlite3.Connection, run_id: str, step: str, move: Move,
                    row: sqlite3.Row, t: float) -> TaskRecord:
    """Judge ``move`` on the task's ``row`` (already fenced by the caller), then write
    its changes and its event."""
    move.check(row["state"])
    _update_task(conn, run_id, step, resolve_changes(move.changes, row, t))
    _insert_event(conn, run_id, **event_args(move.event, row, t))
    return task_record(_fetch_task(conn, run_id, step))


def apply_run(conn: sqlite3.Connection, run_id: str, row: sqlite3.Row, t: float,
              changes: Mapping[str, Any], event: EventDraft | None = None) -> None:
    """Write a run's ``changes`` (judged on its ``row``) and their ``event``, at ``t``."""
    changes = resolve_changes(changes, row, t)
    bad = set(changes) - RUN_COLUMNS
    if bad:
        raise ValueError(f"not run columns: {sorted(bad)}")
    cols = ", ".join(f"{c} = ?" for c in changes)  # names from the fixed set only
    conn.execute(f"UPDATE runs SET {cols} WHERE run_id = ?", (*changes.values(), run_id))
    if event is not None:
        _insert_event(conn, run_id, **event_args(event, row, t))


def start_attempt_in(
    conn: sqlite3.Connection, run_id: str, step: str, *, ttl_s: float, actor: str,
    data: Mapping[str, Any] | None = None, t: float | None = None,
) -> TaskRecord:
    """The body of start_attempt, inside the caller's write transaction."""
    row = _fetch_task(conn, run_id, step)
    t = now() if t is None else t  # the store's clock, so leases follow virtual time in tests
    return apply_task_move(conn, run_id, step, start_move(step, ttl_s=ttl_s, actor=actor, data=data),
                           row, t)


def insert_tasks(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.executemany(f"INSERT INTO tasks ({records.TASK_INSERT}) VALUES (?, ?, ?, ?, ?, ?)", rows)


def insert_run(conn: sqlite3.Connection, run: NewRun, steps: Sequence[str], t: float, *, actor: str,
               reason: str, data: Mapping[str, Any]) -> bool:
    """A new run's row, its PENDING tasks and its creation event (``create_run``, a
    schedule's ``fire_slot``); False, writing nothing, when a run of that id exists."""
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run.run_id,)).fetchone():
        return False
    conn.execute(f"INSERT INTO runs ({records.RUN_INSERT}) VALUES ({', '.join('?' * 9)})",
                 records.run_values(run, t))
    insert_tasks(conn, records.task_values(run.run_id, steps, t))
    _insert_event(conn, run.run_id, "run", actor=actor, reason=reason, t=t, to_state=RunState.PENDING,
                  data=dict(data))
    return True
