"""The PostgreSQL metadata store: one database shared by every host of a deployment.

Same contract and messages as :class:`~segue.store.sqlite.SQLiteStore`, but
PostgreSQL runs writers concurrently (READ COMMITTED), so what SQLite gets
from its single writer is taken explicitly here:

- **Fencing inside the write.** A write locks the rows it judges by
  (``SELECT … FOR UPDATE`` of the task, ``FOR NO KEY UPDATE`` of the run),
  then checks the epoch or state, then writes, in one transaction: a
  concurrent epoch bump waits for the lock, so no write lands on a decision
  made from a stale read. Lock order is always run, then task.
- **The database's clock.** Leases, expiries and timestamps come from
  ``clock_timestamp()`` read after the locks are held, never from the
  client's ``time.time()``, so hosts with skewed clocks agree on who holds a
  lease. ``clock_offset`` (default: ``SEGUE_CLOCK_FILE``, as for
  :func:`~segue.store.base.now`) adds virtual time for tests.
- **Events.** Ids come from one sequence, drawn while the writer holds its
  run's row lock, so within a run ids rise in commit order and a reader
  paging by ``after_id`` never skips an event committed late. Across runs,
  id order is not commit order: the readers of every run's events (the
  webhook outbox, /metrics) page by commit position, the writing
  transaction's id (:mod:`segue.store.postgres_outbox`).
- **Retries.** A transaction cut off by a lost connection is retried (a few
  times, with backoff) when it surely did not commit: it failed before
  COMMIT was sent, or was a deadlock or serialization failure. When the
  connection dies *during* COMMIT, the outcome is looked up: every write
  inserts a commit marker (a fresh token) in its own transaction, and the
  writer probes for it, waiting on the token's index entry until the old
  transaction has ended. Found: it committed, and the result computed before
  COMMIT is returned. Absent: it rolled back and is run again. No transition
  is ever applied twice, and none is lost.

psycopg is imported only when a store is built. Values are bound parameters
(``%s``); only fixed column names are formatted into SQL.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .._canon import canonical_json
from .._faults import fault_point
from .._rngshield import shield_libraries
from ..errors import FencedError, RunExistsError, SegueError, StoreBusyError, StoreError
from ..states import RunState, TaskState
from . import postgres_hot as hot
from . import transitions as rules
from .base import (
    CLOCK_FILE_ENV,
    CheckpointRecord,
    Event,
    Heartbeat,
    NewRun,
    RunRecord,
    Store,
    TaskRecord,
    _clock_offset,
    wall_clock,
)
from .busy import BUSY_TIMEOUT_ENV, busy_timeout_s
from .postgres_extras import PostgresPoolMixin, start_attempt_in
from .postgres_hosts import PostgresHostsMixin
from .postgres_hot import (
    APPEND_EVENT,
    APPEND_RUN_EVENT,
    CREATE_RUN,
    HEARTBEAT,
    RENEW_CONTROLLER,
    REPORT_PROGRESS,
    SET_ATTEMPT_PID,
    TRANSITION_RUN,
)
from .postgres_schedules import PostgresSchedulesMixin
from .postgres_schema import (
    Tx,
    apply_run,
    apply_task_move,
    fence,
    insert_event,
    insert_run,
    insert_tasks,
    lock_run,
    migrate,
    run_row,
    task_row,
    update_task,
    value,
)
from .postgres_step_metrics import PostgresStepMetricsMixin
from .records import (
    checkpoint_record,
    event_of,
    event_record,
    event_values,
    run_record,
    task_record,
    task_values,
)

if TYPE_CHECKING:
    import psycopg

    Conn = psycopg.Connection[dict[str, Any]]

T = TypeVar("T")

TRIES = 5  # one try and four retries, after 0.1, 0.2, 0.4 and 0.8 s
BACKOFF_S = 0.1
CONNECT_TIMEOUT_S = 10.0  # per try: a new connection, or a free one from the pool
OUTCOME_WAIT_S = 60  # how long a probe waits for a transaction whose COMMIT got no answer
# The server ends a session idle inside a transaction this long: a writer frozen
# while holding its run's lock (a stopped VM, SIGSTOP) cannot stall the run for
# ever. Thawed, it finds its transaction rolled back, runs again, and is fenced.
IDLE_IN_TX_TIMEOUT_S = 60
MARKER_TTL_S = 3600.0  # commit markers are needed for seconds; purged after an hour
PURGE_EVERY_S = 600.0
CLOCK_RESYNC_S = 5.0  # how often now() measures the database clock against this host's

_READ = ""  # no transaction: each statement is one snapshot (autocommit)
_WRITE = "BEGIN ISOLATION LEVEL READ COMMITTED"


# A task's moves, decided (transitions) and rendered (postgres_hot) once per distinct call:
# a controller makes the same few calls again and again, and the decision and the
# rendering cost more client time than sending the statement. Pure functions of their
# arguments (typed: 1, 1.0 and True are different keys); an error is raised, never kept.
@functools.lru_cache(maxsize=256, typed=True)
def _planned_task_move(run_id: str, step: str, to: TaskState, actor: str, reason: str,
                       only_from: frozenset[TaskState] | None, count_failure: bool,
                       error: str | None, next_attempt_at: float | None,
                       reset_failures: bool) -> tuple[rules.Move, str, dict[str, Any]]:
    move = rules.task_move(run_id, step, to, actor=actor, reason=reason, only_from=only_from,
                           count_failure=count_failure, error=error,
                           next_attempt_at=next_attempt_at, reset_failures=reset_failures)
    return (move, *hot.render_move(move))


@functools.lru_cache(maxsize=256, typed=True)
def _planned_start_move(step: str, ttl_s: float, actor: str) -> tuple[rules.Move, str, dict[str, Any]]:
    move = rules.start_move(step, ttl_s=ttl_s, actor=actor)
    return (move, *hot.render_move(move))


_COLUMNS: dict[str, tuple[str, ...]] = {}  # the column names of a one-statement write's answer


class _Committed(Exception):
    """A one-statement write committed, but its answer was lost with the connection."""

    def __init__(self, token: uuid.UUID) -> None:
        super().__init__(str(token))
        self.token = token  # its commit marker's


def is_postgres_url(s: object) -> bool:
    """Whether ``s`` names a PostgreSQL database (``postgresql://`` or ``postgres://``)."""
    return isinstance(s, str) and s.lower().startswith(("postgresql://", "postgres://"))


def _label(url: str) -> str:
    """The URL without its password, for messages."""
    url = re.sub(r"(//[^:/@]*):[^@/]*@", r"\1:***@", url)
    return re.sub(r"(password=)[^&\s]*", r"\1***", url)


def _env_offset() -> float:
    path = os.environ.get(CLOCK_FILE_ENV)
    return _clock_offset(path) if path else 0.0


def _import_psycopg() -> tuple[Any, Any]:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as e:
        raise StoreError(
            f"a PostgreSQL metadata store needs psycopg 3 and psycopg_pool ({e.name} is "
            "missing); pip install 'segue[postgres]'"
        ) from e
    shield_libraries()  # the pool's reconnection jitter must not move a step's random stream
    return psycopg, psycopg_pool


class _Transient(Exception):
    """A try that surely did not commit and may be run again (the cause is chained)."""


class PostgresStore(PostgresPoolMixin, PostgresHostsMixin, PostgresStepMetricsMixin,
                    PostgresSchedulesMixin, Store):
    """A :class:`Store` in a PostgreSQL database. Picklable: it travels as its URL.
    The scheduling extras (stats, requests, placed starts) come from
    :class:`~segue.store.postgres_extras.PostgresPoolMixin`.

    One connection pool per process (rebuilt after fork), shared by its threads.
    """

    def __init__(self, url: str, *, clock_offset: Callable[[], float] | None = None,
                 max_connections: int = 8, home: str = "") -> None:
        self.url = url
        self.home = home  # the segue home it serves ("": none), named in RequestRecords
        self._psycopg, self._pool_mod = _import_psycopg()
        self._offset = clock_offset or _env_offset
        self._max = max_connections
        self._lock, self._lock_pid = threading.Lock(), os.getpid()
        self._pool_obj: Any = None
        self._pid = 0
        self._purge_at = 0.0
        self._db_minus_local: float | None = None  # see now()
        self._resync_at = 0.0
        self._cluster_key: str | None = None
        self._listener: Any = None  # opened by the first wait_for_change
        self._migrate()  # fail now on a bad URL or a too-new schema, not at the first query

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url,), {"home": self.home})

    def __repr__(self) -> str:
        return f"PostgresStore({_label(self.url)!r})"

    # -- connections and transactions ------------------------------------------
    def _connect_kwargs(self) -> dict[str, Any]:
        from psycopg.rows import dict_row

        return {"autocommit": True, "row_factory": dict_row,
                "connect_timeout": int(CONNECT_TIMEOUT_S), "application_name": "segue"}

    def _migrate(self) -> None:
        try:
            with self._psycopg.connect(self.url, **self._connect_kwargs()) as conn:
                migrate(conn, _label(self.url))
        except self._psycopg.Error as e:
            raise StoreError(f"cannot open metadata store {_label(self.url)}: {e}") from e

    def _configure(self, conn: Conn) -> None:
        conn.execute("SELECT set_config('idle_in_transaction_session_timeout', %s, false)",
                     (f"{int(IDLE_IN_TX_TIMEOUT_S * 1000)}ms",))
        if os.environ.get(BUSY_TIMEOUT_ENV, "").strip():
            # Unset, a write waits for a row lock until the timeout above frees it.
            conn.execute("SELECT set_config('lock_timeout', %s, false)",
                         (f"{max(1, int(busy_timeout_s() * 1000))}ms",))

    def _busy(self, exc: BaseException) -> StoreBusyError | None:
        """StoreBusyError for a write that ran past ``lock_timeout`` (it rolled back)."""
        if not isinstance(exc, self._psycopg.errors.LockNotAvailable):
            return None
        return StoreBusyError(
            f"the metadata store {_label(self.url)} is busy: another session has held a lock this "
            f"write needs for over {busy_timeout_s():g}s; nothing was written; retry when it lets "
            f"go (${BUSY_TIMEOUT_ENV} sets how long segue waits)")

    def _pool(self) -> Any:
        if self._lock_pid != os.getpid():  # forked: a parent's thread may have held the lock
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        with self._lock:
            if self._pool_obj is None or self._pid != os.getpid():
                # A pool inherited over fork() is dropped, never closed: closing would
                # end the parent's sessions (psycopg's finalizer leaves them alone).
                pool = self._pool_mod.ConnectionPool(
                    self.url, min_size=1, max_size=self._max, open=False,
                    kwargs=self._connect_kwargs(), configure=self._configure,
                    timeout=CONNECT_TIMEOUT_S, name="segue-store")
                pool.open(wait=False)
                self._pool_obj, self._pid = pool, os.getpid()
            return self._pool_obj

    def now(self) -> float:
        """The database's clock (plus the test clock file's offset, as every write
        stamps it), read as this host's clock plus their measured difference. The
        difference is measured again every ``CLOCK_RESYNC_S``, so a caller that
        judges leases at every tick costs no round trip."""
        if self._db_minus_local is None or time.monotonic() >= self._resync_at:
            t0 = wall_clock()
            row = self._run(lambda tx: tx.one("SELECT extract(epoch FROM clock_timestamp())::float8 AS t"),
                            _READ, "")
            t1 = wall_clock()
            self._db_minus_local = float(cast(Any, row)["t"]) - (t0 + t1) / 2
            self._resync_at = time.monotonic() + CLOCK_RESYNC_S
        return wall_clock() + self._db_minus_local + self._offset()

    @property
    def cluster_key(self) -> str:
        """How every host names this database's runs in the cluster-wide device pool:
        the id the schema drew once (URLs differ from host to host)."""
        if self._cluster_key is None:
            row = self._run(lambda tx: tx.one("SELECT id FROM segue_cluster"), _READ, "")
            self._cluster_key = f"postgresql:{cast(Any, row)['id']}"
        return self._cluster_key

    def wait_for_change(self, timeout: float) -> bool:
        """LISTEN/NOTIFY on every run's events (:mod:`segue.store.postgres_listen`);
        sleeps the timeout while notifications are unavailable."""
        if self._listener is None:
            from .postgres_listen import Listener

            self._listener = Listener(self.url, self._connect_kwargs())
        return bool(self._listener.wait(timeout))

    def close(self) -> None:
        """Close this process's pool (a later call opens a new one). Connections in
        use by other threads finish their transaction first."""
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            pool, self._pool_obj = self._pool_obj, None
        if pool is not None and self._pid == os.getpid():
            pool.close()

    def _read(self, body: Callable[[Tx], T]) -> T:
        """Reads take no lock and need no transaction: each answers with one
        statement (READ COMMITTED: one snapshot). A second statement only asks,
        after an empty answer, whether the run (or step) exists at all; runs and
        tasks are never deleted, so the two cannot disagree."""
        return self._run(body, _READ, "")

    def _write(self, body: Callable[[Tx], T]) -> T:
        """READ COMMITTED; ``body`` locks the rows it judges by before judging them."""
        try:
            result = self._run(body, _WRITE, "COMMIT")
        except FencedError as exc:
            self._record_refusal(exc)
            raise
        self._maybe_purge()
        return result

    def _maybe_purge(self) -> None:
        if time.monotonic() >= self._purge_at:
            self._purge_markers()

    def _write_one(self, sql: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """Run one of :mod:`.postgres_hot`'s statements (its own transaction, one round
        trip) and return its row. None: it wrote nothing (its check failed, or the
        connection failed before it committed); the caller then runs the locked path,
        which judges again and retries. A lost answer to a statement that did commit
        raises :class:`_Committed`."""
        token = uuid.uuid4()
        fault_point("store.before_commit")  # as in _once: a write cut off here leaves no trace
        pool = self._pool()
        try:
            conn = pool.getconn()
        except (self._pool_mod.PoolTimeout, self._pool_mod.PoolClosed):
            return None
        lost: BaseException | None = None
        try:
            row = self._execute_one(conn, sql, {**params, "token": token, "offset": self._offset()})
        except self._psycopg.Error as exc:
            if (busy := self._busy(exc)) is not None:
                raise busy from exc
            if not self._transient(exc, conn):
                raise
            lost = exc
        finally:
            pool.putconn(conn)
        if lost is None:
            self._maybe_purge()
            return cast(Any, row)
        self._drop_dead_connections()
        if self._committed(token, lost):
            raise _Committed(token)
        return None

    def _move_one(self, move: rules.Move, run_id: str, step: str, epoch: int | None = None,
                  rendered: tuple[str, dict[str, Any]] | None = None) -> TaskRecord | None:
        """A task's move in one statement (:func:`.postgres_hot.task_move`; ``rendered``:
        its statement, :func:`.postgres_hot.render_move`): its record, or None where the
        statement wrote nothing and the locked path must judge."""
        sql, values = rendered or hot.render_move(move)
        try:
            row = self._write_one(sql, hot.move_params(move, values, run_id=run_id, step=step,
                                                       epoch=epoch))
        except _Committed:
            return self.get_task(run_id, step)  # it moved; the answer was lost on the way
        return None if row is None else task_record(row)

    def _move(self, move: rules.Move, run_id: str, step: str, epoch: int | None,
              rendered: tuple[str, dict[str, Any]] | None = None) -> TaskRecord:
        """A task's move: one statement where it may be made; otherwise the locked path
        (run then task row locked, fenced when ``epoch`` is given) judges it, and refuses
        as ever."""
        moved = self._move_one(move, run_id, step, epoch, rendered)
        if moved is not None:
            return moved

        def body(tx: Tx) -> TaskRecord:
            lock_run(tx, run_id)
            row = task_row(tx, run_id, step, lock=True)
            if epoch is not None:
                fence(run_id, step, row, epoch)
            return apply_task_move(tx, run_id, step, move, row)

        return self._write(body)

    def _run(self, body: Callable[[Tx], T], begin: str, finish: str) -> T:
        last: BaseException | None = None
        for attempt in range(TRIES):
            if attempt:
                time.sleep(BACKOFF_S * 2 ** (attempt - 1))
            try:
                return self._once(body, begin, finish)
            except _Transient as t:
                last = t.__cause__
                self._drop_dead_connections()
        raise StoreError(
            f"metadata store {_label(self.url)}: lost the connection {TRIES} times in a row "
            f"({str(last).strip()}); is the server up?"
        ) from last

    def _once(self, body: Callable[[Tx], T], begin: str, finish: str) -> T:
        pool = self._pool()
        try:
            conn = pool.getconn()
        except (self._pool_mod.PoolTimeout, self._pool_mod.PoolClosed) as e:
            raise _Transient() from e  # no server yet, or another thread's close(): again
        tx = Tx(conn, self._offset())
        try:
            try:
                if begin:
                    conn.execute(begin)  # type: ignore[arg-type]
                result = body(tx)
                if begin == _WRITE:
                    tx.mark_if_written()
                    # Tests kill or stop the process here: a write cut off before
                    # COMMIT must leave no trace, and one held here holds its locks.
                    fault_point("store.before_commit")
            except BaseException as exc:
                self._rollback(conn)
                if self._transient(exc, conn):
                    raise _Transient() from exc
                if (busy := self._busy(exc)) is not None:
                    raise busy from exc
                raise
            if not finish:
                return result
            try:
                self._finish(conn, finish)
            except self._psycopg.Error as exc:
                if finish != "COMMIT":
                    return result  # a probe's answer stays true
                if not self._transient(exc, conn):
                    raise
                if tx.token is None or not self._committed(tx.token, exc):
                    raise _Transient() from exc  # it rolled back (or wrote nothing): again
            return result
        finally:
            pool.putconn(conn)

    def _execute_one(self, conn: Conn, sql: str, params: dict[str, Any]) -> Any:
        """Send one statement and read its row (tests replace it to lose the answer).
        Each pooled connection keeps one cursor for these (building a cursor costs a
        third of what a statement costs this process), which reads rows as tuples (a
        statement's column names are read once, not decoded from every answer) in binary
        (no float is printed by the server and parsed here)."""
        cur = conn.__dict__.get("_segue_cursor")
        if cur is None:
            from psycopg.rows import tuple_row

            cur = conn.__dict__["_segue_cursor"] = conn.cursor(row_factory=tuple_row, binary=True)
        row = cur.execute(sql, params).fetchone()  # type: ignore[arg-type]
        if row is None:
            return None
        names = _COLUMNS.get(sql)
        if names is None or len(names) != len(row):
            if len(_COLUMNS) >= 1024:
                _COLUMNS.clear()
            names = _COLUMNS[sql] = tuple(c.name for c in cur.description or ())
        return dict(zip(names, row, strict=True))

    def _finish(self, conn: Conn, finish: str) -> None:
        """Send COMMIT or ROLLBACK (tests replace it to lose the answer to a COMMIT)."""
        conn.execute(finish)  # type: ignore[arg-type]

    def _rollback(self, conn: Conn) -> None:
        if not conn.closed and not conn.broken:
            try:
                conn.execute("ROLLBACK")
            except self._psycopg.Error:
                pass  # the pool discards a connection it cannot reset

    def _transient(self, exc: BaseException, conn: Conn) -> bool:
        errors = self._psycopg.errors
        if isinstance(exc, (errors.SerializationFailure, errors.DeadlockDetected)):
            return True  # the server rolled the transaction back
        # Any error that leaves the session dead (a restart, a FATAL such as the
        # idle-in-transaction timeout, a cut network): the server rolled back.
        return isinstance(exc, self._psycopg.Error) and (conn.closed or conn.broken)

    def _drop_dead_connections(self) -> None:
        try:
            self._pool().check()  # after a server restart every idle connection is dead
        except Exception:  # noqa: BLE001 - best effort; the next try reports the failure
            pass

    def _committed(self, token: uuid.UUID, exc: BaseException) -> bool:
        """Whether the transaction that inserted ``token`` committed.

        Inserting the same token waits on the unique index until that transaction
        has ended, then conflicts if it committed; the probe always rolls back.
        """
        def probe(tx: Tx) -> bool:
            tx.one("SELECT set_config('lock_timeout', %s, true)", (f"{int(OUTCOME_WAIT_S)}s",))
            return tx.one("INSERT INTO commit_markers (token, at) VALUES (%s, 0)"
                          " ON CONFLICT DO NOTHING RETURNING token", (token,)) is None

        try:
            return self._run(probe, _WRITE, "ROLLBACK")
        except (StoreError, self._psycopg.Error) as e:
            raise StoreError(
                f"metadata store {_label(self.url)}: the connection died during a COMMIT "
                f"({str(exc).strip()}) and whether it committed is unknown ({str(e).strip()}); "
                "check `segue status` before retrying"
            ) from e

    def _purge_markers(self) -> None:
        self._purge_at = time.monotonic() + PURGE_EVERY_S
        try:
            with self._pool().connection() as conn:
                conn.execute("DELETE FROM commit_markers WHERE at <"
                             " extract(epoch FROM clock_timestamp()) - %s", (MARKER_TTL_S,))
        except Exception:  # noqa: BLE001 - housekeeping; the next purge will catch up
            pass

    def _record_refusal(self, exc: FencedError) -> None:
        """Append a ``fenced`` event for a write refused to a stale epoch, in a
        transaction of its own (the refused one rolled back). Best effort."""
        info = getattr(exc, "fence", None)
        if not info:
            return

        def body(tx: Tx) -> None:
            lock_run(tx, info["run_id"])
            insert_event(tx, info["run_id"], "fenced", step=info.get("step"), actor=info["actor"],
                         reason=f"write refused: {exc}", t=tx.now(),
                         data={"epoch": info["epoch"], "current": info["current"]})

        try:
            self._run(body, _WRITE, "COMMIT")
        except (SegueError, self._psycopg.Error):
            pass

    # -- runs ------------------------------------------------------------------
    def create_run(self, run: NewRun, steps: Sequence[str], *, actor: str) -> RunRecord:
        """Write, READ COMMITTED: a second creator of the same id waits on the key, then conflicts."""
        steps = list(steps)
        dup = sorted({s for s in steps if steps.count(s) > 1})
        if dup:
            raise ValueError(f"run {run.run_id!r}: step names must be unique; repeated: {dup}")
        try:  # one statement (:mod:`.postgres_hot`); a taken id goes to the locked path
            row = self._write_one(CREATE_RUN, {
                "run_id": run.run_id, "flow_name": run.flow_name, "flow_path": run.flow_path,
                "params": canonical_json(run.params), "fingerprint": canonical_json(run.fingerprint),
                "options": canonical_json(run.options), "steps": steps, "actor": str(actor),
                "data": canonical_json({"steps": steps})})
        except _Committed:
            return self.get_run(run.run_id)  # created (its marker says so); the answer was lost
        if row is not None:
            return run_record(cast(Any, row))

        def body(tx: Tx) -> RunRecord:
            row = insert_run(tx, run, steps, actor=actor, reason="run created", data={"steps": steps})
            if row is None:
                raise RunExistsError(run.run_id)
            return run_record(cast(Any, row))

        return self._write(body)

    def get_run(self, run_id: str) -> RunRecord:
        """Read: one statement, one snapshot, no lock (see :meth:`_read`)."""
        return self._read(lambda tx: run_record(cast(Any, run_row(tx, run_id))))

    def list_runs(self, *, states: Collection[RunState] | None = None, flow: str | None = None,
                  limit: int | None = None, offset: int = 0) -> list[RunRecord]:
        """Read: one statement, one snapshot, no lock (see :meth:`_read`)."""
        where: list[str] = []
        args: list[Any] = []
        if states is not None:
            where.append("state = ANY(%s)")
            args.append([RunState(s).value for s in states])
        if flow is not None:
            where.append("flow_name = %s")
            args.append(flow)
        sql = "SELECT * FROM runs" + (f" WHERE {' AND '.join(where)}" if where else "")
        sql += " ORDER BY created_at DESC, ord DESC LIMIT %s OFFSET %s"
        args += [None if limit is None else int(limit), int(offset)]
        return self._read(lambda tx: [run_record(cast(Any, r)) for r in tx.all(sql, args)])

    def run_counts(self) -> dict[tuple[RunState, str], int]:
        """Read: one aggregate statement, one snapshot, no lock."""
        rows = self._read(lambda tx: tx.all(
            "SELECT state, flow_name, COUNT(*) AS n FROM runs GROUP BY state, flow_name"))
        return {(RunState(r["state"]), r["flow_name"]): int(r["n"]) for r in rows}

    def set_run_options(self, run_id: str, options: dict[str, Any], *, actor: str, reason: str) -> RunRecord:
        """Write, READ COMMITTED, under the run's row lock."""
        def body(tx: Tx) -> RunRecord:
            lock_run(tx, run_id)
            t = tx.now()
            row = tx.one("UPDATE runs SET options = %s, updated_at = %s WHERE run_id = %s"
                         " RETURNING *", (canonical_json(options), t, run_id))
            insert_event(tx, run_id, "options", actor=actor, reason=reason, t=t, data=dict(options))
            return run_record(cast(Any, row))

        return self._write(body)

    def transition_run(self, run_id: str, to: RunState, *, actor: str, reason: str,
                       only_from: Collection[RunState] | None = None,
                       controller_epoch: int | None = None) -> RunRecord:
        """Write, READ COMMITTED: the run's row lock is taken before the fence and
        the state are judged, so a controller takeover cannot slip in between.
        One statement when the move is legal from the run's state (:mod:`.postgres_hot`);
        a move that is not (or a no-op) is judged by the locked path."""
        move = rules.run_move(to, actor=actor, reason=reason, only_from=only_from)
        try:
            row = self._write_one(TRANSITION_RUN, {
                "run_id": run_id, "sources": sorted(move.sources), "to": move.to, "actor": str(actor),
                "reason": reason, "controller_epoch": controller_epoch})
        except _Committed:
            return self.get_run(run_id)  # it moved; the answer was lost on the way
        if row is not None:
            return run_record(cast(Any, row))

        def body(tx: Tx) -> RunRecord:
            row = lock_run(tx, run_id)
            if controller_epoch is not None:
                rules.check_controller_epoch(run_id, row, controller_epoch)
                fault_point("store.fence_checked")
            if rules.is_noop(move, row["state"]):
                return run_record(cast(Any, row))
            move.check(row["state"])
            return run_record(apply_run(tx, run_id, row, move.changes, move.event))

        return self._write(body)

    # -- controller lease ------------------------------------------------------
    def acquire_controller(self, run_id: str, *, pid: int, host: str, ttl_s: float,
                           steal: bool = False, expect_epoch: int | None = None) -> int:
        """Write, READ COMMITTED, under the run's row lock; the lease is judged by the
        database's clock read after the lock is held."""
        def body(tx: Tx) -> int:
            row = lock_run(tx, run_id)
            claim = rules.claim_controller(run_id, row, tx.now(), pid=pid, host=host, ttl_s=ttl_s,
                                           steal=steal, expect_epoch=expect_epoch)
            apply_run(tx, run_id, row, claim.changes, claim.event)
            return claim.epoch

        return self._write(body)

    def renew_controller(self, run_id: str, epoch: int, ttl_s: float) -> RunRecord:
        """Write, READ COMMITTED, fenced under the run's row lock; database clock.
        One statement when ``epoch`` still holds the run (:mod:`.postgres_hot`)."""
        try:
            row = self._write_one(RENEW_CONTROLLER, {"run_id": run_id, "epoch": epoch,
                                                     "ttl_s": float(ttl_s)})
        except _Committed:
            row = None  # renewed; the locked path renews it again and answers
        if row is not None:
            return run_record(cast(Any, row))

        def body(tx: Tx) -> RunRecord:
            row = lock_run(tx, run_id)
            rules.check_controller_epoch(run_id, row, epoch)
            fault_point("store.fence_checked")
            return run_record(apply_run(tx, run_id, row, rules.renew_changes(ttl_s)))

        return self._write(body)

    def release_controller(self, run_id: str, epoch: int) -> None:
        """Write, READ COMMITTED, under the run's row lock."""
        def body(tx: Tx) -> None:
            row = lock_run(tx, run_id)
            event = rules.releases(row, epoch)
            if event is None:
                return  # superseded or already released: nothing of ours to give up
            apply_run(tx, run_id, row, rules.RELEASE_CONTROLLER, event)

        self._write(body)

    # -- tasks -----------------------------------------------------------------
    def get_tasks(self, run_id: str) -> list[TaskRecord]:
        """Read: one statement, one snapshot, no lock (see :meth:`_read`)."""
        def body(tx: Tx) -> list[TaskRecord]:
            rows = tx.all("SELECT * FROM tasks WHERE run_id = %s ORDER BY ord", (run_id,))
            if not rows:
                run_row(tx, run_id)
            return [task_record(cast(Any, r)) for r in rows]

        return self._read(body)

    def get_task(self, run_id: str, step: str) -> TaskRecord:
        """Read: one statement, one snapshot, no lock (see :meth:`_read`)."""
        return self._read(lambda tx: task_record(cast(Any, task_row(tx, run_id, step))))

    def transition_task(self, run_id: str, step: str, to: TaskState, *, actor: str, reason: str,
                        epoch: int | None = None, only_from: Collection[TaskState] | None = None,
                        count_failure: bool = False, error: str | None = None,
                        next_attempt_at: float | None = None,
                        reset_failures: bool = False) -> TaskRecord:
        """Write, READ COMMITTED: run then task row locked before the epoch and state
        are judged (fenced when ``epoch`` is given). One statement when the move is
        legal from the task's state (:func:`.postgres_hot.task_move`); otherwise the
        locked path judges it and raises as ever."""
        only = None if only_from is None else frozenset(TaskState(s) for s in only_from)
        move, sql, values = _planned_task_move(run_id, step, TaskState(to), actor, reason, only,
                                               count_failure, error, next_attempt_at, reset_failures)
        return self._move(move, run_id, step, epoch, (sql, values))

    def record_decision(self, run_id: str, step: str, *, controller_epoch: int, actor: str, reason: str,
                        add: Sequence[str] = (), skip: Sequence[str] = (),
                        data: Mapping[str, Any] | None = None, epoch: int = 0) -> bool:
        """Write, READ COMMITTED, under the run's row lock (the controller's epoch is judged
        under it, and the run's events are appended under it)."""
        def body(tx: Tx) -> bool:
            rules.check_controller_epoch(run_id, lock_run(tx, run_id), controller_epoch)
            if add and tx.one("SELECT 1 AS x FROM tasks WHERE run_id = %s AND step = %s",
                              (run_id, add[0])) is not None:
                return False
            t = tx.now()
            first = tx.one("SELECT COALESCE(MAX(ord), -1) + 1 AS n FROM tasks WHERE run_id = %s", (run_id,))
            base = int(cast(Any, first)["n"]) if first is not None else 0
            if add:
                insert_tasks(tx, task_values(run_id, add, t, first=base, epoch=epoch))
            skipped = []
            for name in skip:
                row = task_row(tx, run_id, name, lock=True)
                if row["state"] == TaskState.PENDING.value:
                    apply_task_move(tx, run_id, name, rules.skip_move(run_id, name, actor=actor, reason=reason),
                                    row)
                    skipped.append(name)
            ev = rules.decision_event(step, actor=actor, reason=reason, add=add, skip=skipped, data=data)
            insert_event(tx, run_id, **rules.event_args(ev, None, t))
            return True

        return self._write(body)

    def restart_path(self, run_id: str, step: str, *, reset: Sequence[str], drop: Sequence[str],
                     actor: str, reason: str) -> None:
        """Write, READ COMMITTED, under the run's row lock, then each task's."""
        def body(tx: Tx) -> None:
            lock_run(tx, run_id)
            t = tx.now()
            floors: dict[str, int] = {}
            for name in drop:
                row = tx.one("DELETE FROM tasks WHERE run_id = %s AND step = %s RETURNING epoch", (run_id, name))
                rules.raise_floor(floors, name, 0 if row is None else int(cast(Any, row)["epoch"]))
            for name in reset:
                row = task_row(tx, run_id, name, lock=True)
                got = tx.one("SELECT COALESCE(MAX(seq), 0) AS n FROM checkpoints WHERE run_id = %s AND step = %s",
                             (run_id, name))
                insert_event(tx, run_id, "restart-step", step=name, actor=actor, reason=reason, t=t,
                             data=rules.discarded(int(cast(Any, got)["n"]) if got is not None else 0))
                tx.one("UPDATE checkpoints SET status = 'pruned' WHERE run_id = %s AND step = %s"
                       " AND status = 'committed' RETURNING seq", (run_id, name))
                if row["state"] != TaskState.PENDING.value:
                    apply_task_move(tx, run_id, name, rules.restart_moves(run_id, name, actor=actor, reason=reason),
                                    row)
            insert_event(tx, run_id, "restart-path", step=step, actor=actor, reason=reason, t=t,
                         data={"reset": list(reset), "dropped": len(drop), "floors": floors})

        self._write(body)

    def start_attempt(self, run_id: str, step: str, *, ttl_s: float, actor: str) -> TaskRecord:
        """Write, READ COMMITTED: run then task row locked, so two starters get
        distinct epochs and the second is refused by the state it then sees. One
        statement when the task may start (:func:`.postgres_hot.task_move`)."""
        move, sql, values = _planned_start_move(step, ttl_s, actor)
        moved = self._move_one(move, run_id, step, rendered=(sql, values))
        if moved is not None:
            return moved
        return self._write(lambda tx: start_attempt_in(tx, run_id, step, ttl_s=ttl_s, actor=actor))

    def set_attempt_pid(self, run_id: str, step: str, epoch: int, pid: int, host: str) -> None:
        """Write, READ COMMITTED, fenced under the task's row lock. One statement when the
        attempt still holds the task (:mod:`.postgres_hot`); otherwise the locked path
        judges it and refuses as ever."""
        self._fenced_update(SET_ATTEMPT_PID, run_id, step, epoch, {"pid": pid, "host": host},
                            need_running=True)

    def _fenced_update(self, hot: Any, run_id: str, step: str, epoch: int, changes: dict[str, Any], *,
                       need_running: bool = False) -> None:
        """``changes`` to the task its attempt ``epoch`` still holds: one statement (``hot``,
        :mod:`.postgres_hot`), else the locked path, which judges and refuses as ever."""
        try:
            if self._write_one(hot, {"run_id": run_id, "step": step, "epoch": epoch, **changes}) is not None:
                return
        except _Committed:
            return  # recorded; the answer was lost on the way

        def body(tx: Tx) -> None:
            fence(run_id, step, task_row(tx, run_id, step, lock=True), epoch, need_running=need_running)
            update_task(tx, run_id, step, {**changes, "updated_at": tx.now()})

        self._write(body)

    def heartbeat(self, run_id: str, step: str, epoch: int, ttl_s: float) -> Heartbeat:
        """Write, READ COMMITTED, fenced under the task's row lock; the lease is the
        database's clock plus ``ttl_s``. The run's state is read without a lock.
        One statement when the attempt still holds the task (:mod:`.postgres_hot`)."""
        try:
            row = self._write_one(HEARTBEAT, {"run_id": run_id, "step": step, "epoch": epoch,
                                              "ttl_s": float(ttl_s)})
        except _Committed:
            row = None  # extended; the locked path extends it again and answers
        if row is not None:
            return Heartbeat(run_state=RunState(row["run_state"]), lease_until=row["lease_until"])

        def body(tx: Tx) -> Heartbeat:
            fence(run_id, step, task_row(tx, run_id, step, lock=True), epoch, need_running=True)
            t = tx.now()
            update_task(tx, run_id, step, {"lease_until": t + ttl_s, "updated_at": t})
            # SQLiteStore also extends the attempt's device allocation here; the
            # pool tables are not ported to PostgreSQL yet.
            return Heartbeat(run_state=RunState(run_row(tx, run_id)["state"]), lease_until=t + ttl_s)

        return self._write(body)

    def report_progress(self, run_id: str, step: str, epoch: int, done: float,
                        total: float | None) -> None:
        """Write, READ COMMITTED, fenced under the task's row lock. One statement when the
        attempt still holds the task (:mod:`.postgres_hot`)."""
        self._fenced_update(REPORT_PROGRESS, run_id, step, epoch,
                            {"progress_done": done, "progress_total": total})

    def commit_checkpoint(self, run_id: str, step: str, epoch: int, *, seq: int, path: str,
                          position: Any, nbytes: int,
                          duration_s: float | None = None) -> CheckpointRecord:
        """Write, READ COMMITTED, fenced under the run and task row locks (which also
        serialize the seq check of two writers)."""
        position_json = canonical_json(position)

        def body(tx: Tx) -> CheckpointRecord:
            lock_run(tx, run_id)
            task = task_row(tx, run_id, step, lock=True)
            fence(run_id, step, task, epoch)
            newest = value(tx.one("SELECT MAX(seq) FROM checkpoints WHERE run_id = %s"
                                   " AND step = %s", (run_id, step)))
            rules.check_seq(run_id, step, seq, newest)
            t = tx.now()
            row = tx.one(
                "INSERT INTO checkpoints (run_id, step, seq, epoch, path, created_at, position,"
                " nbytes, status) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, 'committed') RETURNING *",
                (run_id, step, seq, epoch, path, t, position_json, nbytes))
            event = rules.checkpoint_event(task, step, seq=seq, epoch=epoch, path=path,
                                           position=position, nbytes=nbytes, duration_s=duration_s)
            insert_event(tx, run_id, **rules.event_args(event, task, t))
            return checkpoint_record(cast(Any, row))

        return self._write(body)

    def list_checkpoints(self, run_id: str, step: str | None = None, *,
                         statuses: Collection[str] = ("committed",)) -> list[CheckpointRecord]:
        """Read: one statement, one snapshot, no lock (see :meth:`_read`)."""
        wanted = sorted(set(statuses))

        def body(tx: Tx) -> list[CheckpointRecord]:
            rows = tx.all(
                "SELECT c.* FROM checkpoints c JOIN tasks t ON t.run_id = c.run_id AND t.step = c.step"
                " WHERE c.run_id = %s AND c.status = ANY(%s) AND (%s::text IS NULL OR c.step = %s)"
                " ORDER BY t.ord, c.seq DESC", (run_id, wanted, step, step))
            if not rows:
                _ = run_row(tx, run_id) if step is None else task_row(tx, run_id, step)
            return [checkpoint_record(cast(Any, r)) for r in rows]

        return self._read(body)

    def set_checkpoint_status(self, run_id: str, step: str, seq: int, status: str, *,
                              actor: str, reason: str) -> None:
        """Write, READ COMMITTED, under the run's row lock."""
        rules.check_checkpoint_status(status)

        def body(tx: Tx) -> None:
            lock_run(tx, run_id)
            task_row(tx, run_id, step)
            row = tx.one("SELECT status FROM checkpoints WHERE run_id = %s AND step = %s"
                         " AND seq = %s", (run_id, step, seq))
            if row is None:
                raise StoreError(f"run {run_id!r} has no checkpoint {seq} of step {step!r}")
            if row["status"] == status:
                return
            t = tx.now()
            tx.one("UPDATE checkpoints SET status = %s WHERE run_id = %s AND step = %s AND seq = %s"
                   " RETURNING seq", (status, run_id, step, seq))
            insert_event(tx, run_id, "checkpoint", step=step, actor=actor, reason=reason, t=t,
                         from_state=row["status"], to_state=status, data={"seq": seq})

        self._write(body)

    def complete_task(self, run_id: str, step: str, epoch: int, *, output_ref: str | None,
                      actor: str) -> TaskRecord:
        """Write, READ COMMITTED: RUNNING -> SUCCEEDED, fenced under the run and task locks;
        one statement when ``epoch`` still holds the RUNNING task."""
        move = rules.complete_move(step, epoch=epoch, output_ref=output_ref, actor=actor)
        return self._move(move, run_id, step, epoch)

    # -- events ----------------------------------------------------------------
    def append_event(self, run_id: str, kind: str, *, actor: str, reason: str,
                     step: str | None = None, data: dict[str, Any] | None = None) -> Event:
        """Write, READ COMMITTED, under the run's row lock (which orders the run's event ids).
        One statement when the run (and the step) exist (:mod:`.postgres_hot`)."""
        values = event_values(run_id, kind, step=step, actor=actor, reason=reason, t=0.0, data=data)
        try:
            row = self._write_one(APPEND_RUN_EVENT if step is None else APPEND_EVENT, {
                "run_id": run_id, "step": step, "actor": values[3], "kind": kind,
                "reason": reason, "data": values[8]})
        except _Committed as c:
            token = c.token  # written; the answer was lost: find the event its transaction wrote
            row = self._read(lambda tx: tx.one(
                "SELECT e.id, e.time FROM events e, commit_markers m WHERE m.token = %s"
                " AND e.run_id = %s AND e.xid::text::bigint %% 4294967296 = m.xmin::text::bigint"
                " ORDER BY e.id DESC LIMIT 1", (token, run_id)))
            if row is None:
                raise StoreError(f"metadata store {_label(self.url)}: an event of run {run_id!r} "
                                 "was committed but cannot be found again") from c
        if row is not None:
            return event_of(row["id"], (*values[:2], row["time"], *values[3:]))

        def body(tx: Tx) -> Event:
            lock_run(tx, run_id)
            if step is not None:
                task_row(tx, run_id, step)
            return insert_event(tx, run_id, kind, step=step, actor=actor, reason=reason,
                                t=tx.now(), data=data)

        return self._write(body)

    def list_events(self, run_id: str, *, after_id: int = 0,
                    kinds: Collection[str] | None = None) -> list[Event]:
        """Read: one statement, one snapshot, no lock. Within a run, ids rise in commit
        order, so a snapshot that holds an event holds every earlier event of its run."""
        def body(tx: Tx) -> list[Event]:
            rows = tx.all(
                "SELECT * FROM events WHERE run_id = %s AND id > %s"
                " AND (%s::text[] IS NULL OR kind = ANY(%s::text[])) ORDER BY id",
                (run_id, after_id, wanted, wanted))
            if not rows:
                run_row(tx, run_id)
            return [event_record(r) for r in rows]

        wanted = None if kinds is None else list(kinds)
        return self._read(body)
