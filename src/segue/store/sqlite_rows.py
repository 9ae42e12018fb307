"""Row-level helpers of the SQLite store: fetch, fence, update, convert.

Every function here runs inside the caller's transaction and never commits;
the methods of :class:`~segue.store.sqlite.SQLiteStore` own the transactions.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from .._canon import canonical_json
from ..errors import ControllerConflictError, FencedError, StoreError, UnknownRunError
from ..states import Actor, RunState, TaskState, check_task
from .base import CheckpointRecord, Event, RunRecord, TaskRecord, now

BUSY_TIMEOUT_S = 30.0  # how long a writer waits for the lock (and a fresh file's WAL switch)

_TASK_COLUMNS = frozenset(
    {
        "state", "epoch", "attempts", "failures", "pid", "host", "lease_until",
        "progress_done", "progress_total", "output_ref", "error", "next_attempt_at",
        "started_at", "finished_at", "updated_at",
    }
)


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


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


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


def _check_epoch(
    run_id: str, step: str, row: sqlite3.Row, epoch: int, *, need_running: bool = False
) -> None:
    cur = int(row["epoch"])
    if cur != epoch:
        raise _fenced(
            f"attempt epoch {epoch} of step {step!r} in run {run_id!r} was superseded by "
            f"epoch {cur}; this attempt must stop",
            run_id=run_id, step=step, actor=Actor.WORKER, epoch=epoch, current=cur,
        )
    if need_running and row["state"] != TaskState.RUNNING.value:
        # Someone (pause deadline, failure detector) took the task from this
        # attempt without starting a new one; it must not re-claim a lease.
        raise _fenced(
            f"attempt epoch {epoch} of step {step!r} in run {run_id!r} no longer holds "
            f"the task (now {row['state']}); this attempt must stop",
            run_id=run_id, step=step, actor=Actor.WORKER, epoch=epoch, current=cur,
        )


def _check_controller_epoch(run_id: str, row: sqlite3.Row, epoch: int) -> None:
    cur = int(row["controller_epoch"])
    if cur != epoch:
        raise _fenced(
            f"controller epoch {epoch} of run {run_id!r} was superseded by epoch {cur}; "
            "this controller must stop",
            run_id=run_id, step=None, actor=Actor.CONTROLLER, epoch=epoch, current=cur,
        )


def check_handover(run_id: str, row: Any, expect_epoch: int) -> None:
    """A hand-over of the controller lease goes through only if nobody took it since the claim."""
    cur = int(row["controller_epoch"])
    if cur != expect_epoch:
        raise ControllerConflictError(
            f"run {run_id!r} was claimed with controller epoch {expect_epoch}, but epoch {cur} "
            f"(pid {row['controller_pid']} on host {row['controller_host']}) took it since; "
            "this controller stands down")


def _fenced(
    msg: str, *, run_id: str, step: str | None, actor: str, epoch: int, current: int
) -> FencedError:
    """A FencedError carrying what the store records about the refusal."""
    err = FencedError(msg)
    err.fence = {  # type: ignore[attr-defined]
        "run_id": run_id, "step": step, "actor": actor, "epoch": epoch, "current": current,
    }
    return err


# -- helpers: writes inside a transaction -------------------------------------------
def _update_task(
    conn: sqlite3.Connection, run_id: str, step: str, changes: dict[str, Any]
) -> None:
    bad = set(changes) - _TASK_COLUMNS
    if bad:
        raise ValueError(f"not task columns: {sorted(bad)}")
    cols = ", ".join(f"{c} = ?" for c in changes)
    conn.execute(
        f"UPDATE tasks SET {cols} WHERE run_id = ? AND step = ?",
        (*changes.values(), run_id, step),
    )


def _insert_event(
    conn: sqlite3.Connection,
    run_id: str,
    kind: str,
    *,
    actor: str,
    reason: str,
    t: float,
    step: str | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    data = dict(data or {})
    frm = None if from_state is None else str(from_state)
    to = None if to_state is None else str(to_state)
    cur = conn.execute(
        "INSERT INTO events (run_id, step, time, actor, kind, from_state, to_state, reason, data)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (run_id, step, t, str(actor), kind, frm, to, reason, canonical_json(data)),
    )
    if cur.lastrowid is None:  # pragma: no cover - sqlite always sets it for an INSERT
        raise StoreError("event insert returned no id")
    return Event(
        id=cur.lastrowid, run_id=run_id, step=step, time=t, actor=str(actor), kind=kind,
        from_state=frm, to_state=to, reason=reason, data=json.loads(canonical_json(data)),
    )


# -- helpers: rows to records ---------------------------------------------------------
def _run_record(r: sqlite3.Row) -> RunRecord:
    return RunRecord(
        run_id=r["run_id"],
        flow_name=r["flow_name"],
        flow_path=r["flow_path"],
        params=json.loads(r["params"]),
        fingerprint=json.loads(r["fingerprint"]),
        options=json.loads(r["options"]),
        state=RunState(r["state"]),
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        controller_epoch=r["controller_epoch"],
        controller_pid=r["controller_pid"],
        controller_host=r["controller_host"],
        controller_lease_until=r["controller_lease_until"],
    )


def _task_record(r: sqlite3.Row) -> TaskRecord:
    return TaskRecord(
        run_id=r["run_id"],
        step=r["step"],
        state=TaskState(r["state"]),
        epoch=r["epoch"],
        attempts=r["attempts"],
        failures=r["failures"],
        pid=r["pid"],
        host=r["host"],
        lease_until=r["lease_until"],
        progress_done=r["progress_done"],
        progress_total=r["progress_total"],
        output_ref=r["output_ref"],
        error=r["error"],
        next_attempt_at=r["next_attempt_at"],
        started_at=r["started_at"],
        finished_at=r["finished_at"],
        updated_at=r["updated_at"],
    )


def _checkpoint_record(r: sqlite3.Row) -> CheckpointRecord:
    return CheckpointRecord(
        run_id=r["run_id"],
        step=r["step"],
        seq=r["seq"],
        epoch=r["epoch"],
        path=r["path"],
        created_at=r["created_at"],
        position=json.loads(r["position"]),
        nbytes=r["nbytes"],
        status=r["status"],
    )


def _event(r: sqlite3.Row) -> Event:
    return Event(
        id=r["id"],
        run_id=r["run_id"],
        step=r["step"],
        time=r["time"],
        actor=r["actor"],
        kind=r["kind"],
        from_state=r["from_state"],
        to_state=r["to_state"],
        reason=r["reason"],
        data=json.loads(r["data"]),
    )


def start_attempt_in(
    conn: sqlite3.Connection, run_id: str, step: str, *, ttl_s: float, actor: str,
    data: dict[str, Any] | None = None, t: float | None = None,
) -> TaskRecord:
    """The body of start_attempt, inside the caller's write transaction."""
    row = _fetch_task(conn, run_id, step)
    cur = TaskState(row["state"])
    # The table allows RUNNING only from PENDING and RETRYING.
    check_task(cur, TaskState.RUNNING)
    t = now() if t is None else t  # the store's clock, so leases follow virtual time in tests
    epoch = int(row["epoch"]) + 1
    attempts = int(row["attempts"]) + 1
    _update_task(
        conn, run_id, step,
        {
            "state": TaskState.RUNNING.value,
            "epoch": epoch,
            "attempts": attempts,
            "pid": None,
            "host": None,
            "lease_until": t + ttl_s,
            "next_attempt_at": None,
            "started_at": row["started_at"] if row["started_at"] is not None else t,
            "finished_at": None,
            "updated_at": t,
        },
    )
    _insert_event(
        conn, run_id, "task", step=step, actor=actor, t=t,
        reason=f"attempt {attempts} started", from_state=cur,
        to_state=TaskState.RUNNING, data={"epoch": epoch, "attempt": attempts, **(data or {})},
    )
    return _task_record(_fetch_task(conn, run_id, step))
