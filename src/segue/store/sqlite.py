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
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._canon import canonical_json
from .._faults import fault_point
from ..errors import FencedError, RunExistsError, StoreError
from ..states import RunState, TaskState
from . import transitions as rules
from .base import CheckpointRecord, Event, Heartbeat, NewRun, RunRecord, Store, TaskRecord, now
from .busy import busy_error, is_busy
from .busy import busy_timeout_s as busy_timeout_s_env
from .migrations import connect
from .records import checkpoint_record, event_record, run_record, task_record, task_values
from .sqlite_hosts import SQLiteHostsMixin
from .sqlite_pool import SQLitePoolMixin
from .sqlite_rows import (
    PerThreadConnection,
    _fetch_run,
    _fetch_task,
    _insert_event,
    _update_task,
    apply_run,
    apply_task_move,
    insert_run,
    insert_tasks,
    start_attempt_in,
)
from .sqlite_schedules import SQLiteSchedulesMixin
from .sqlite_step_metrics import SQLiteStepMetricsMixin

if TYPE_CHECKING:
    from .base import Clock


class SQLiteStore(PerThreadConnection, SQLitePoolMixin, SQLiteHostsMixin, SQLiteStepMetricsMixin,
                  SQLiteSchedulesMixin, Store):
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
            if not insert_run(conn, run, steps, t, actor=actor, reason="run created", data={"steps": steps}):
                raise RunExistsError(run.run_id)
            return run_record(_fetch_run(conn, run.run_id))

    def get_run(self, run_id: str) -> RunRecord:
        with self._read() as conn:
            return run_record(_fetch_run(conn, run_id))

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
            return [run_record(r) for r in conn.execute(sql, args)]

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
            return run_record(_fetch_run(conn, run_id))

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
        move = rules.run_move(to, actor=actor, reason=reason, only_from=only_from)
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            if controller_epoch is not None:
                rules.check_controller_epoch(run_id, row, controller_epoch)
            if rules.is_noop(move, row["state"]):
                return run_record(row)
            move.check(row["state"])
            apply_run(conn, run_id, row, self._clock(), move.changes, move.event)
            return run_record(_fetch_run(conn, run_id))

    # -- controller lease ------------------------------------------------------
    def acquire_controller(
        self, run_id: str, *, pid: int, host: str, ttl_s: float, steal: bool = False,
        expect_epoch: int | None = None,
    ) -> int:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            t = self._clock()
            claim = rules.claim_controller(run_id, row, t, pid=pid, host=host, ttl_s=ttl_s,
                                           steal=steal, expect_epoch=expect_epoch)
            apply_run(conn, run_id, row, t, claim.changes, claim.event)
            return claim.epoch

    def renew_controller(self, run_id: str, epoch: int, ttl_s: float) -> RunRecord:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            rules.check_controller_epoch(run_id, row, epoch)
            apply_run(conn, run_id, row, self._clock(), rules.renew_changes(ttl_s))
            return run_record(_fetch_run(conn, run_id))

    def release_controller(self, run_id: str, epoch: int) -> None:
        with self._write() as conn:
            row = _fetch_run(conn, run_id)
            event = rules.releases(row, epoch)
            if event is None:
                return  # superseded or already released: nothing of ours to give up
            apply_run(conn, run_id, row, self._clock(), rules.RELEASE_CONTROLLER, event)

    # -- tasks -----------------------------------------------------------------
    def get_tasks(self, run_id: str) -> list[TaskRecord]:
        with self._read() as conn:
            _fetch_run(conn, run_id)
            rows = conn.execute("SELECT * FROM tasks WHERE run_id = ? ORDER BY ord", (run_id,))
            return [task_record(r) for r in rows]

    def get_task(self, run_id: str, step: str) -> TaskRecord:
        with self._read() as conn:
            return task_record(_fetch_task(conn, run_id, step))

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
        move = rules.task_move(run_id, step, to, actor=actor, reason=reason, only_from=only_from,
                               count_failure=count_failure, error=error,
                               next_attempt_at=next_attempt_at, reset_failures=reset_failures)
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            if epoch is not None:
                rules.check_epoch(run_id, step, row, epoch)
            return apply_task_move(conn, run_id, step, move, row, self._clock())

    def record_decision(self, run_id: str, step: str, *, controller_epoch: int, actor: str, reason: str,
                        add: Sequence[str] = (), skip: Sequence[str] = (),
                        data: Mapping[str, Any] | None = None, epoch: int = 0) -> bool:
        with self._write() as conn:
            rules.check_controller_epoch(run_id, _fetch_run(conn, run_id), controller_epoch)
            if add and conn.execute("SELECT 1 FROM tasks WHERE run_id = ? AND step = ?",
                                    (run_id, add[0])).fetchone():
                return False
            t = self._clock()
            first = conn.execute("SELECT COALESCE(MAX(ord), -1) + 1 FROM tasks WHERE run_id = ?",
                                 (run_id,)).fetchone()[0]
            insert_tasks(conn, task_values(run_id, add, t, first=first, epoch=epoch))
            skipped = []
            for name in skip:
                row = _fetch_task(conn, run_id, name)
                if row["state"] == TaskState.PENDING.value:
                    apply_task_move(conn, run_id, name, rules.skip_move(run_id, name, actor=actor, reason=reason),
                                    row, t)
                    skipped.append(name)
            ev = rules.decision_event(step, actor=actor, reason=reason, add=add, skip=skipped, data=data)
            _insert_event(conn, run_id, **rules.event_args(ev, None, t))
            return True

    def restart_path(self, run_id: str, step: str, *, reset: Sequence[str], drop: Sequence[str],
                     actor: str, reason: str) -> None:
        with self._write() as conn:
            _fetch_run(conn, run_id)
            t = self._clock()
            floors: dict[str, int] = {}
            for name in drop:
                row = conn.execute("DELETE FROM tasks WHERE run_id = ? AND step = ? RETURNING epoch",
                                   (run_id, name)).fetchone()
                rules.raise_floor(floors, name, 0 if row is None else row[0])
            for name in reset:
                row = _fetch_task(conn, run_id, name)
                floor = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM checkpoints WHERE run_id = ? AND step = ?",
                                     (run_id, name)).fetchone()[0]
                _insert_event(conn, run_id, "restart-step", step=name, actor=actor, reason=reason, t=t,
                              data=rules.discarded(floor))
                conn.execute("UPDATE checkpoints SET status = 'pruned' WHERE run_id = ? AND step = ?"
                             " AND status = 'committed'", (run_id, name))
                if row["state"] != TaskState.PENDING.value:
                    apply_task_move(conn, run_id, name, rules.restart_moves(run_id, name, actor=actor,
                                                                            reason=reason), row, t)
            _insert_event(conn, run_id, "restart-path", step=step, actor=actor, reason=reason, t=t,
                          data={"reset": list(reset), "dropped": len(drop), "floors": floors})

    def start_attempt(self, run_id: str, step: str, *, ttl_s: float, actor: str) -> TaskRecord:
        with self._write() as conn:
            return start_attempt_in(conn, run_id, step, ttl_s=ttl_s, actor=actor, t=self._clock())

    def set_attempt_pid(self, run_id: str, step: str, epoch: int, pid: int, host: str) -> None:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            rules.check_epoch(run_id, step, row, epoch, need_running=True)
            _update_task(conn, run_id, step, {"pid": pid, "host": host, "updated_at": self._clock()})

    def heartbeat(self, run_id: str, step: str, epoch: int, ttl_s: float) -> Heartbeat:
        with self._write() as conn:
            row = _fetch_task(conn, run_id, step)
            rules.check_epoch(run_id, step, row, epoch, need_running=True)
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
            rules.check_epoch(run_id, step, row, epoch)
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
            rules.check_epoch(run_id, step, row, epoch)
            newest = conn.execute(
                "SELECT MAX(seq) FROM checkpoints WHERE run_id = ? AND step = ?", (run_id, step)
            ).fetchone()[0]
            rules.check_seq(run_id, step, seq, newest)
            t = self._clock()
            conn.execute(
                "INSERT INTO checkpoints (run_id, step, seq, epoch, path, created_at, position,"
                " nbytes, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'committed')",
                (run_id, step, seq, epoch, path, t, position_json, nbytes),
            )
            event = rules.checkpoint_event(row, step, seq=seq, epoch=epoch, path=path,
                                           position=position, nbytes=nbytes, duration_s=duration_s)
            _insert_event(conn, run_id, **rules.event_args(event, row, t))
            return checkpoint_record(
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
            return [checkpoint_record(r) for r in conn.execute(sql, params)]

    def set_checkpoint_status(
        self, run_id: str, step: str, seq: int, status: str, *, actor: str, reason: str
    ) -> None:
        rules.check_checkpoint_status(status)
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
            rules.check_epoch(run_id, step, row, epoch)
            move = rules.complete_move(step, epoch=epoch, output_ref=output_ref, actor=actor)
            return apply_task_move(conn, run_id, step, move, row, self._clock())

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
            return [event_record(r) for r in conn.execute(sql + " ORDER BY id", args)]
