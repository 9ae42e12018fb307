"""The SQLite metadata store: the default backend, one database file per home.

Each public method is one explicit transaction: writes take ``BEGIN IMMEDIATE``,
validate the state change and the fencing epoch, write the row and its event,
then commit; any exception rolls everything back. Values are always bound
parameters. This module must never hold a connection across threads or
processes: each thread (of each process) opens its own, lazily.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._canon import canonical_json
from .._faults import fault_point
from ..errors import (
    ControllerConflictError,
    FencedError,
    IllegalTransitionError,
    RunExistsError,
    StoreError,
)
from ..states import Actor, RunState, TaskState, check_run, check_task
from .base import (
    CheckpointRecord,
    Clock,
    Event,
    Heartbeat,
    NewRun,
    RunRecord,
    Store,
    TaskRecord,
    now,
)
from .busy import busy_error, is_busy
from .busy import busy_timeout_s as busy_timeout_s_env
from .migrations import connect
from .sqlite_hosts import SQLiteHostsMixin
from .sqlite_pool import SQLitePoolMixin
from .sqlite_rows import (
    PerThreadConnection,
    _check_controller_epoch,
    _check_epoch,
    _checkpoint_record,
    _event,
    _fetch_run,
    _fetch_task,
    _fmt_time,
    _insert_event,
    _run_record,
    _task_record,
    _update_task,
    check_handover,
    start_attempt_in,
)
from .sqlite_step_metrics import SQLiteStepMetricsMixin

CHECKPOINT_STATUSES = frozenset({"committed", "quarantined", "pruned"})

# Task columns a write may set. Column names are formatted into SQL, so they
# must come from this fixed set, never from a caller.
# Leaving RUNNING drops the attempt's claim on the task.
_NO_ATTEMPT: dict[str, Any] = {"pid": None, "host": None, "lease_until": None}


class SQLiteStore(PerThreadConnection, SQLitePoolMixin, SQLiteHostsMixin, SQLiteStepMetricsMixin,
                  Store):
    """A :class:`Store` in one SQLite file. Picklable: it travels as its path."""

    def __init__(self, path: str | Path, *, clock: Clock = now,
                 busy_timeout_s: float | None = None) -> None:
        self.path = Path(path)
        # How long a write waits for another process's write lock before it fails
        # with StoreBusyError; None: $SEGUE_STORE_BUSY_TIMEOUT_S, else 30 s. A
        # store rebuilt in another process from its path follows the variable.
        self.busy_timeout_s = busy_timeout_s if busy_timeout_s is not None else busy_timeout_s_env()
        # Every lease and expiry is computed from this clock (time is a
        # dependency): tests pass a virtual one instead of sleeping. A store
        # rebuilt in another process from its path gets the default clock,
        # which follows SEGUE_CLOCK_FILE there.
        self._clock = clock
        self._local = threading.local()
        # Open (and migrate) now, so a database that is too new or unreadable
        # fails at construction rather than at the first query.
        self._conn()

    def now(self) -> float:
        return self._clock()

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self.path),))

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"

    # -- connections and transactions ------------------------------------------
    def _open(self) -> sqlite3.Connection:
        conn = connect(self.path)  # an older home is migrated here
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
        return conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction. IMMEDIATE takes the write lock up front, so two
        processes never both hold read locks and deadlock upgrading them; a lock
        held past the busy timeout is a StoreBusyError, before anything is written."""
        conn = self._conn()
        with self._busy_is_one_line(conn):
            conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            # Tests kill or fail the process here to prove that a write cut off
            # before COMMIT leaves no trace and no lock behind.
            fault_point("store.before_commit")
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if isinstance(exc, FencedError):
                self._record_refusal(exc)
            if is_busy(exc):  # rolled back above: nothing of it was written
                raise busy_error(self.path, conn, self.busy_timeout_s) from exc
            raise

    @contextmanager
    def _busy_is_one_line(self, conn: sqlite3.Connection) -> Iterator[None]:
        try:
            yield
        except sqlite3.OperationalError as exc:
            if not is_busy(exc):
                raise
            raise busy_error(self.path, conn, self.busy_timeout_s) from exc

    def _record_refusal(self, exc: FencedError) -> None:
        """Append a ``fenced`` event for a write refused to a stale epoch.

        The refused transaction rolled back, so this is a transaction of its
        own. It makes every zombie's refused commit visible (``segue events``,
        and tests count them to prove a zombie really tried and was stopped).
        Best effort: failing to record must never hide the FencedError itself.
        """
        fence = getattr(exc, "fence", None)
        if not fence:
            return
        conn = self._conn()
        try:
            conn.execute("BEGIN IMMEDIATE")
            _insert_event(
                conn, fence["run_id"], "fenced", step=fence.get("step"), actor=fence["actor"],
                reason=f"write refused: {exc}", t=self._clock(),
                data={"epoch": fence["epoch"], "current": fence["current"]},
            )
            conn.execute("COMMIT")
        except sqlite3.Error:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: every query inside sees the same snapshot."""
        conn = self._conn()
        with self._busy_is_one_line(conn):  # WAL readers rarely wait (a checkpoint, a recovery)
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    conn.execute("COMMIT")

    # -- runs ------------------------------------------------------------------
    def create_run(self, run: NewRun, steps: Sequence[str], *, actor: str) -> RunRecord:
        steps = list(steps)
        dup = sorted({s for s in steps if steps.count(s) > 1})
        if dup:
            raise ValueError(f"run {run.run_id!r}: step names must be unique; repeated: {dup}")
        t = self._clock()
        with self._write() as conn:
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run.run_id,)).fetchone():
                raise RunExistsError(run.run_id)
            conn.execute(
                "INSERT INTO runs (run_id, flow_name, flow_path, params, fingerprint, options,"
                " state, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    run.run_id, run.flow_name, run.flow_path, canonical_json(run.params),
                    canonical_json(run.fingerprint), canonical_json(run.options),
                    RunState.PENDING.value, t, t,
                ),
            )
            conn.executemany(
                "INSERT INTO tasks (run_id, step, ord, state, updated_at) VALUES (?, ?, ?, ?, ?)",
                [(run.run_id, s, i, TaskState.PENDING.value, t) for i, s in enumerate(steps)],
            )
            _insert_event(
                conn, run.run_id, "run", actor=actor, reason="run created", t=t,
                to_state=RunState.PENDING, data={"steps": steps},
            )
            return _run_record(_fetch_run(conn, run.run_id))

    def get_run(self, run_id: str) -> RunRecord:
        with self._read() as conn:
            return _run_record(_fetch_run(conn, run_id))

    def list_runs(self, *, states: Collection[RunState] | None = None, flow: str | None = None,
                  limit: int | None = None, offset: int = 0) -> list[RunRecord]:
        where: list[str] = []
        args: list[str | int] = []
        if states is not None:
            where.append(f"state IN ({', '.join('?' for _ in states)})" if states else "0")
            args += [s.value for s in states]
        if flow is not None:
            where.append("flow_name = ?")
            args.append(flow)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?"
        args += [-1 if limit is None else int(limit), int(offset)]
        with self._read() as conn:
            return [_run_record(r) for r in conn.execute(sql, args)]

    def run_counts(self) -> dict[tuple[RunState, str], int]:
        with self._read() as conn:
            rows = conn.execute("SELECT state, flow_name, COUNT(*) AS n FROM runs GROUP BY state, flow_name")
            return {(RunState(r["state"]), r["flow_name"]): int(r["n"]) for r in rows}

    def set_run_options(self, run_id: str, options: dict[str, Any], *, actor: str, reason: str) -> RunRecord:
        with self._write() as conn:
            _fetch_run(conn, run_id)
            t = self._clock()
            conn.execute("UPDATE runs SET options = ?, updated_at = ? WHERE run_id = ?",
                         (canonical_json(options), t, run_id))
            _insert_event(conn, run_id, "options", actor=actor, reason=reason, t=t, data=dict(options))
            return _run_record(_fetch_run(conn, run_id))

    def transition_run(
        self,
        run_id: str,
        to: RunState,
        *,
        actor: str,
        reason: str,
        only_from: Collection[RunState] | None = None,
        controller_epoch: int | None = None,
    ) -> RunRecord:
        to = RunState(to)
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            if controller_epoch is not None:
                _check_controller_epoch(run_id, row, controller_epoch)
            cur = RunState(row["state"])
            if cur == to:
                return _run_record(row)
            check_run(cur, to)
            if only_from is not None and cur not in only_from:
                allowed = ", ".join(sorted(RunState(s).value for s in only_from))
                raise IllegalTransitionError(
                    "a run", cur.value, to.value, f"this change is only allowed from {allowed}"
                )
            t = self._clock()
            conn.execute(
                "UPDATE runs SET state = ?, updated_at = ? WHERE run_id = ?",
                (to.value, t, run_id),
            )
            _insert_event(
                conn, run_id, "run", actor=actor, reason=reason, t=t,
                from_state=cur, to_state=to,
            )
            return _run_record(_fetch_run(conn, run_id))

    # -- controller lease ------------------------------------------------------
    def acquire_controller(
        self, run_id: str, *, pid: int, host: str, ttl_s: float, steal: bool = False,
        expect_epoch: int | None = None,
    ) -> int:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            t = self._clock()
            lease = row["controller_lease_until"]
            live = lease is not None and lease > t
            if expect_epoch is not None:
                check_handover(run_id, row, expect_epoch)
            elif live and not steal:
                raise ControllerConflictError(
                    f"run {run_id!r} is already driven by a live controller "
                    f"(pid {row['controller_pid']} on host {row['controller_host']}, "
                    f"lease until {_fmt_time(lease)}); wait for it, pause the run, "
                    "or stop that process"
                )
            epoch = int(row["controller_epoch"]) + 1
            conn.execute(
                "UPDATE runs SET controller_epoch = ?, controller_pid = ?, controller_host = ?,"
                " controller_lease_until = ?, updated_at = ? WHERE run_id = ?",
                (epoch, pid, host, t + ttl_s, t, run_id),
            )
            data: dict[str, Any] = {
                "epoch": epoch, "pid": pid, "host": host, "lease_until": t + ttl_s,
            }
            if live:
                data["stolen_from"] = {
                    "epoch": row["controller_epoch"],
                    "pid": row["controller_pid"],
                    "host": row["controller_host"],
                }
            _insert_event(
                conn, run_id, "controller", actor=Actor.CONTROLLER, t=t, data=data,
                reason="controller lease stolen" if live else "controller lease acquired",
            )
            return epoch

    def renew_controller(self, run_id: str, epoch: int, ttl_s: float) -> RunRecord:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            _check_controller_epoch(run_id, row, epoch)
            t = self._clock()
            conn.execute(
                "UPDATE runs SET controller_lease_until = ?, updated_at = ? WHERE run_id = ?",
                (t + ttl_s, t, run_id),
            )
            return _run_record(_fetch_run(conn, run_id))

    def release_controller(self, run_id: str, epoch: int) -> None:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            if row["controller_epoch"] != epoch or row["controller_lease_until"] is None:
                return  # superseded or already released: nothing of ours to give up
            t = self._clock()
            conn.execute(
                "UPDATE runs SET controller_pid = NULL, controller_host = NULL,"
                " controller_lease_until = NULL, updated_at = ? WHERE run_id = ?",
                (t, run_id),
            )
            _insert_event(
                conn, run_id, "controller", actor=Actor.CONTROLLER, t=t,
                reason="controller lease released", data={"epoch": epoch},
            )

    # -- tasks -----------------------------------------------------------------
    def get_tasks(self, run_id: str) -> list[TaskRecord]:
        with self._read() as conn:
            _fetch_run(conn, run_id)
            rows = conn.execute("SELECT * FROM tasks WHERE run_id = ? ORDER BY ord", (run_id,))
            return [_task_record(r) for r in rows]

    def get_task(self, run_id: str, step: str) -> TaskRecord:
        with self._read() as conn:
            return _task_record(_fetch_task(conn, run_id, step))

    def transition_task(
        self,
        run_id: str,
        step: str,
        to: TaskState,
        *,
        actor: str,
        reason: str,
        epoch: int | None = None,
        only_from: Collection[TaskState] | None = None,
        count_failure: bool = False,
        error: str | None = None,
        next_attempt_at: float | None = None,
        reset_failures: bool = False,
    ) -> TaskRecord:
        to = TaskState(to)
        if to == TaskState.RUNNING:
            # A RUNNING task without a new epoch would let the previous
            # attempt's zombie write again: fencing needs start_attempt.
            raise ValueError(
                f"step {step!r} in run {run_id!r}: use start_attempt to move a task to RUNNING; "
                "it raises the epoch that fences older attempts"
            )
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            if epoch is not None:
                _check_epoch(run_id, step, row, epoch)
            cur = TaskState(row["state"])
            check_task(cur, to)
            if only_from is not None and cur not in only_from:
                allowed = ", ".join(sorted(TaskState(s).value for s in only_from))
                raise IllegalTransitionError(
                    "a task", cur.value, to.value, f"this change is only allowed from {allowed}"
                )
            t = self._clock()
            failures = 0 if reset_failures else int(row["failures"])
            changes: dict[str, Any] = {
                "state": to.value,
                "failures": failures + (1 if count_failure else 0),
                # The backoff deadline only means something while RETRYING.
                "next_attempt_at": next_attempt_at if to == TaskState.RETRYING else None,
                "finished_at": t if to.done else None,
                "updated_at": t,
            }
            if error is not None:
                changes["error"] = error
            if cur == TaskState.RUNNING:
                changes.update(_NO_ATTEMPT)
            _update_task(conn, run_id, step, changes)
            data: dict[str, Any] = {"epoch": row["epoch"]}
            if error is not None:
                data["error"] = error
            _insert_event(
                conn, run_id, "task", step=step, actor=actor, reason=reason, t=t,
                from_state=cur, to_state=to, data=data,
            )
            return _task_record(_fetch_task(conn, run_id, step))

    def start_attempt(self, run_id: str, step: str, *, ttl_s: float, actor: str) -> TaskRecord:
        with self._write() as conn:
            return start_attempt_in(conn, run_id, step, ttl_s=ttl_s, actor=actor, t=self._clock())

    def set_attempt_pid(self, run_id: str, step: str, epoch: int, pid: int, host: str) -> None:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            _check_epoch(run_id, step, row, epoch, need_running=True)
            _update_task(conn, run_id, step, {"pid": pid, "host": host, "updated_at": self._clock()})

    def heartbeat(self, run_id: str, step: str, epoch: int, ttl_s: float) -> Heartbeat:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            _check_epoch(run_id, step, row, epoch, need_running=True)
            t = self._clock()
            lease = t + ttl_s
            _update_task(conn, run_id, step, {"lease_until": lease, "updated_at": t})
            # The attempt's device allocation lives exactly as long as its lease.
            conn.execute(
                "UPDATE allocations SET lease_until = ? WHERE run_id = ? AND step = ? AND epoch = ?"
                " AND released_at IS NULL",
                (lease, run_id, step, epoch),
            )
            run_state = RunState(_fetch_run(conn, run_id)["state"])
            return Heartbeat(run_state=run_state, lease_until=lease)

    def report_progress(
        self, run_id: str, step: str, epoch: int, done: float, total: float | None
    ) -> None:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            _check_epoch(run_id, step, row, epoch)
            _update_task(
                conn, run_id, step,
                {"progress_done": done, "progress_total": total, "updated_at": self._clock()},
            )

    def commit_checkpoint(
        self,
        run_id: str,
        step: str,
        epoch: int,
        *,
        seq: int,
        path: str,
        position: Any,
        nbytes: int,
        duration_s: float | None = None,
    ) -> CheckpointRecord:
        position_json = canonical_json(position)
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            _check_epoch(run_id, step, row, epoch)
            newest = conn.execute(
                "SELECT MAX(seq) FROM checkpoints WHERE run_id = ? AND step = ?", (run_id, step)
            ).fetchone()[0]
            if newest is not None and seq <= newest:
                raise StoreError(
                    f"checkpoint seq {seq} of step {step!r} in run {run_id!r} does not exceed "
                    f"the newest recorded seq {newest}; each checkpoint needs a larger seq"
                )
            t = self._clock()
            conn.execute(
                "INSERT INTO checkpoints (run_id, step, seq, epoch, path, created_at, position,"
                " nbytes, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'committed')",
                (run_id, step, seq, epoch, path, t, position_json, nbytes),
            )
            _insert_event(
                conn, run_id, "checkpoint", step=step, actor=Actor.WORKER, t=t,
                reason=f"checkpoint {seq} committed",
                data={
                    "seq": seq, "epoch": epoch, "path": path,
                    "position": position, "nbytes": nbytes,
                    **({} if duration_s is None else {"duration_s": duration_s}),
                    **_progress_of(row),
                },
            )
            return _checkpoint_record(
                conn.execute(
                    "SELECT * FROM checkpoints WHERE run_id = ? AND step = ? AND seq = ?",
                    (run_id, step, seq),
                ).fetchone()
            )

    def list_checkpoints(
        self, run_id: str, step: str | None = None, *, statuses: Collection[str] = ("committed",)
    ) -> list[CheckpointRecord]:
        wanted = sorted(set(statuses))
        with self._read() as conn:
            if step is None:
                _fetch_run(conn, run_id)
            else:
                _fetch_task(conn, run_id, step)
            if not wanted:
                return []
            # Only the number of placeholders is formatted in; values stay bound.
            marks = ", ".join("?" for _ in wanted)
            sql = (
                "SELECT c.* FROM checkpoints c JOIN tasks t"
                " ON t.run_id = c.run_id AND t.step = c.step"
                f" WHERE c.run_id = ? AND c.status IN ({marks})"
            )
            params: list[Any] = [run_id, *wanted]
            if step is not None:
                sql += " AND c.step = ?"
                params.append(step)
            sql += " ORDER BY t.ord, c.seq DESC"
            return [_checkpoint_record(r) for r in conn.execute(sql, params)]

    def set_checkpoint_status(
        self, run_id: str, step: str, seq: int, status: str, *, actor: str, reason: str
    ) -> None:
        if status not in CHECKPOINT_STATUSES:
            raise ValueError(
                f"checkpoint status must be one of {sorted(CHECKPOINT_STATUSES)}, not {status!r}"
            )
        with self._write() as conn:
            _fetch_task(conn, run_id, step)
            row = conn.execute(
                "SELECT status FROM checkpoints WHERE run_id = ? AND step = ? AND seq = ?",
                (run_id, step, seq),
            ).fetchone()
            if row is None:
                raise StoreError(f"run {run_id!r} has no checkpoint {seq} of step {step!r}")
            if row["status"] == status:
                return
            t = self._clock()
            conn.execute(
                "UPDATE checkpoints SET status = ? WHERE run_id = ? AND step = ? AND seq = ?",
                (status, run_id, step, seq),
            )
            _insert_event(
                conn, run_id, "checkpoint", step=step, actor=actor, reason=reason, t=t,
                from_state=row["status"], to_state=status, data={"seq": seq},
            )

    def complete_task(
        self, run_id: str, step: str, epoch: int, *, output_ref: str | None, actor: str
    ) -> TaskRecord:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            _check_epoch(run_id, step, row, epoch)
            cur = TaskState(row["state"])
            check_task(cur, TaskState.SUCCEEDED)  # the table allows it only from RUNNING
            t = self._clock()
            _update_task(
                conn, run_id, step,
                {
                    "state": TaskState.SUCCEEDED.value,
                    "output_ref": output_ref,
                    "next_attempt_at": None,
                    "finished_at": t,
                    "updated_at": t,
                    **_NO_ATTEMPT,
                },
            )
            _insert_event(
                conn, run_id, "task", step=step, actor=actor, t=t, reason="output committed",
                from_state=cur, to_state=TaskState.SUCCEEDED,
                data={"epoch": epoch, "output_ref": output_ref},
            )
            return _task_record(_fetch_task(conn, run_id, step))

    # -- events ----------------------------------------------------------------
    def append_event(
        self,
        run_id: str,
        kind: str,
        *,
        actor: str,
        reason: str,
        step: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event:
        with self._write() as conn:
            if step is None:
                _fetch_run(conn, run_id)
            else:
                _fetch_task(conn, run_id, step)
            return _insert_event(
                conn, run_id, kind, step=step, actor=actor, reason=reason, t=self._clock(), data=data
            )

    def list_events(self, run_id: str, *, after_id: int = 0,
                    kinds: Collection[str] | None = None) -> list[Event]:
        sql, args = "SELECT * FROM events WHERE run_id = ? AND id > ?", [run_id, after_id]
        if kinds is not None:
            sql += f" AND kind IN ({', '.join('?' for _ in kinds)})" if kinds else " AND 0"
            args += list(kinds)
        with self._read() as conn:
            _fetch_run(conn, run_id)
            return [_event(r) for r in conn.execute(sql + " ORDER BY id", args)]


# -- helpers: connection setup ----------------------------------------------------


def _progress_of(row: sqlite3.Row) -> dict[str, Any]:
    """The step's reported progress as of a checkpoint commit, for its event: what the
    UI charts (a position is the step's own, not progress)."""
    if row["progress_done"] is None:
        return {}
    return {"progress": {"done": row["progress_done"], "total": row["progress_total"]}}
