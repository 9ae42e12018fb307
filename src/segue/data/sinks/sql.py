"""A SQL table sink (SQLite, PostgreSQL): staged rows, published with a ledger row.

Rows are staged in ``segue_staged_TABLE`` tagged ``RUN/STEP/eEPOCH/pPART``.
After the checkpoint commits, one database transaction copies a part's rows
into the table, deletes them from staging and advances the ledger row
``segue_sink_ledger(run_id, step, sink) -> (epoch, committed)``: the rows and
the position they reach are written together, so a publish repeated after a
crash finds the part already counted and skips it. ``mode="upsert"`` copies
with ``ON CONFLICT (key) DO UPDATE`` instead, idempotent even without the
ledger. Every publish first checks the ledger epoch: a zombie is refused.

A table that does not exist is created in the transaction of the first
publish, with the types of the first batch's values (staged in a table of
those types: :func:`segue.data._sql.column_type`); values a text column
cannot hold as they are (dicts, lists...) are stored as JSON. A database
error no retry can fix (a constraint, a missing column) fails the step at
once (DataError); busy, locked or lost connections stay retryable.

The table belongs to one step of one run (``segue_sink_owner``, see
:mod:`.sql_owner`): another run is refused unless its mode says otherwise
(``append``, ``overwrite``, or ``upsert``, which merges by key). Opened
without a committed state (``--restart-step``), the sink takes back what its
step published when it can: upsert re-merges by key, and a table holding only
this step's rows is emptied; otherwise it refuses rather than duplicate rows.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from ...errors import FencedError
from .._sql import Db, as_text, column_type, ident, is_text, not_retried
from ..errors import DataError, SinkOwnedError
from .base import Scope, Sink
from .sql_owner import OWNERS, TableOwnership

MODES = ("transactional", "upsert", "append", "overwrite")

LEDGER = """CREATE TABLE IF NOT EXISTS segue_sink_ledger (
    run_id TEXT NOT NULL, step TEXT NOT NULL, sink TEXT NOT NULL,
    epoch BIGINT NOT NULL, committed BIGINT NOT NULL,
    PRIMARY KEY (run_id, step, sink))"""


class SqlSink(Sink):
    """Insert dict records into ``table`` with exactly-once semantics.

    ``columns``: the record keys to store, one column each; empty: the
    existing table's columns. A missing table is created (see the module doc),
    so it needs ``columns``; with ``key`` it gets that primary key.
    """

    def __init__(self, url: str, table: str, columns: Sequence[str] = (), *, mode: str = "transactional",
                 key: Sequence[str] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if mode == "upsert" and not key:
            raise ValueError("mode='upsert' needs key=[columns of a unique index]")
        self.url = url
        self.table = ident(table)
        self.columns = [ident(c) for c in columns]
        self.mode = mode
        self.key = [ident(k) for k in key]
        self.staged_table = f"segue_staged_{self.table.replace('.', '_')}"
        self._db: Db | None = None
        self._scope: Scope | None = None
        self._buf: list[tuple[Any, ...]] = []
        self._next_part = 0
        self._pending: list[int] = []
        self._own: TableOwnership | None = None
        self._text: list[bool] = []  # per column: a text column (values it cannot bind go as JSON)

    @property
    def own(self) -> TableOwnership:
        if self._own is None:
            s = self.scope
            self._own = TableOwnership(self.db, self.table, s.run_id, s.step, self.mode)
        return self._own

    @property
    def db(self) -> Db:
        if self._db is None:
            self._db = Db(self.url)
        return self._db

    @property
    def scope(self) -> Scope:
        if self._scope is None:
            raise RuntimeError("sink used before open()")
        return self._scope

    def _tag(self, part: int, epoch: int | None = None) -> str:
        s = self.scope
        return f"{s.prefix}e{s.epoch if epoch is None else epoch}/p{part:08d}"

    def _txn_fenced(self, advance: bool) -> int:
        """BEGIN, lock the ledger row, check the epoch; returns the committed part count."""
        s, db = self.scope, self.db
        db.begin()
        args = (s.run_id, s.step, self.table)
        lock = " FOR UPDATE" if db.dialect == "postgres" else ""
        row = db.execute("SELECT epoch, committed FROM segue_sink_ledger WHERE run_id = ? AND step = ? "
                         f"AND sink = ?{lock}", args).fetchone()
        if row is None:
            db.execute("INSERT INTO segue_sink_ledger VALUES (?, ?, ?, ?, 0)", (*args, s.epoch))
            return 0
        if row[0] > s.epoch:
            db.rollback()
            raise FencedError(f"publish to {self.table} from epoch {s.epoch} rejected: epoch {row[0]} "
                              f"owns it; this attempt must stop")
        if advance and row[0] != s.epoch:
            db.execute("UPDATE segue_sink_ledger SET epoch = ? WHERE run_id = ? AND step = ? AND sink = ?",
                       (s.epoch, *args))
        return int(row[1])

    def _publish_parts(self, parts: list[tuple[int, int]], committed: int) -> None:
        """Inside a fenced transaction: copy staged parts (part, epoch) not yet counted."""
        cols = ", ".join(self.columns)
        conflict = ""
        if self.mode == "upsert":
            sets = ", ".join(f"{c} = excluded.{c}" for c in self.columns if c not in self.key) or None
            conflict = f" ON CONFLICT ({', '.join(self.key)}) DO " + (f"UPDATE SET {sets}" if sets else "NOTHING")
        top = committed
        for part, epoch in parts:
            if part < committed:
                continue  # published before a crash: the ledger says so
            tag = self._tag(part, epoch)
            self.db.execute(f"INSERT INTO {self.table} ({cols}) SELECT {cols} FROM {self.staged_table} "
                            f"WHERE segue_tag = ?{conflict}", (tag,))
            self.db.execute(f"DELETE FROM {self.staged_table} WHERE segue_tag = ?", (tag,))
            top = max(top, part + 1)
        if top != committed:
            s = self.scope
            self.db.execute("UPDATE segue_sink_ledger SET committed = ? WHERE run_id = ? AND step = ? "
                            "AND sink = ?", (top, s.run_id, s.step, self.table))

    def _missing(self) -> DataError:
        return DataError(f"table {self.table} does not exist and SqlSink was given no columns to create "
                         f"it with; pass columns=[...] or create the table first")

    def preflight(self, run_id: str, step: str) -> None:
        if self.url.startswith("sqlite:///") and not os.path.exists(self.url[len("sqlite:///"):]):
            if not self.columns:
                raise self._missing()
            return  # nothing there yet; connecting would create the file
        db = Db(self.url)
        try:
            if not self.columns and not db.table_exists(self.table):
                raise self._missing()
            try:
                db.execute("SELECT 1 FROM segue_sink_owner WHERE 1 = 0").fetchall()
            except Exception:  # noqa: BLE001 - no ownership table: no run claimed anything yet
                return
            db.begin()
            try:
                TableOwnership(db, self.table, run_id, step, self.mode).claim_at_open()
            except SinkOwnedError:
                raise
            except Exception:  # noqa: BLE001 - anything else is checked at start
                pass
            finally:
                db.rollback()  # a check only: the claim itself is the first start's
        finally:
            db.close()

    def _check_columns(self) -> None:
        """Take the table's columns if none were given; refuse a declared column it lacks."""
        found = [name for name, _ in self.db.column_types(self.table)]
        if not found:
            if not self.columns:
                raise self._missing()
            return  # created by the first publish
        if not self.columns:
            self.columns = [ident(c) for c in found]
        have = {c.lower() for c in found}
        lacking = [c for c in self.columns if c.lower() not in have]
        if lacking:
            raise DataError(f"table {self.table} has no column {', '.join(lacking)} (its columns: "
                            f"{', '.join(found)}); add them to the table or leave them out of columns=")

    def _ensure_staging(self) -> None:
        """Inside stage's transaction: the staging table, typed like the table or, while there
        is none, like the first batch's values."""
        db = self.db
        if not db.table_exists(self.staged_table):
            cols = ", ".join(self.columns)
            if db.table_exists(self.table):
                db.execute(f"CREATE TABLE IF NOT EXISTS {self.staged_table} AS SELECT {cols}, "
                           f"CAST(NULL AS TEXT) AS segue_tag FROM {self.table} WHERE 1 = 0")
            else:
                typed = ", ".join(f"{c} {column_type([row[i] for row in self._buf], db.dialect)}"
                                  for i, c in enumerate(self.columns))
                db.execute(f"CREATE TABLE IF NOT EXISTS {self.staged_table} ({typed}, segue_tag TEXT)")
        types = {c.lower(): t for c, t in db.column_types(self.staged_table)}
        self._text = [is_text(types.get(c.lower(), "")) for c in self.columns]

    def _ensure_table(self) -> None:
        """Inside a publish transaction: create a missing table with the staging table's types."""
        db = self.db
        if db.table_exists(self.table):
            return
        types = {c.lower(): t for c, t in db.column_types(self.staged_table)}
        cols = ", ".join(f"{c} {types[c.lower()]}" for c in self.columns)
        key = f", PRIMARY KEY ({', '.join(self.key)})" if self.key else ""
        db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({cols}{key})")

    def open(self, scope: Scope, state: dict[str, Any] | None) -> None:
        self._scope = scope
        self._own = None  # bound to this connection: rebuilt after close()
        self._text = []
        try:
            with not_retried(f"table {self.table}"):
                self._open(state)
        except BaseException:
            self.close()  # a sink that failed to open holds no connection
            raise

    def _open(self, state: dict[str, Any] | None) -> None:
        db = self.db
        for ddl in (LEDGER, OWNERS):
            try:
                db.execute(ddl)
            except Exception:  # noqa: BLE001 - a concurrent creator won the race
                db.rollback()
        self._check_columns()
        try:
            committed = self._txn_fenced(advance=True)
            self.own.claim_at_open()
            next_part = 0 if state is None else int(state["next_part"])
            if state is None and committed > 0:
                committed = self._take_back(committed)
            if committed > next_part:
                raise DataError(
                    f"table {self.table} already holds output past the restored checkpoint "
                    f"(part {committed} > {next_part}): a newer checkpoint was quarantined; "
                    f"start a new run into a clean table"
                )
            if state is not None and state["pending"]:
                self._ensure_table()
                self.own.before_publish()
                self._publish_parts([(p["part"], p["epoch"]) for p in state["pending"]], committed)
            keep = [self._tag(p["part"], p["epoch"]) for p in (state or {}).get("pending", [])]
            pre = self.scope.prefix
            if db.table_exists(self.staged_table):
                db.execute(f"DELETE FROM {self.staged_table} WHERE substr(segue_tag, 1, ?) = ?"
                           + "".join(" AND segue_tag <> ?" for _ in keep), (len(pre), pre, *keep))
            db.commit()
        except BaseException:
            db.rollback()
            raise
        self._next_part = next_part
        self._pending = []

    def _take_back(self, committed: int) -> int:
        """Inside open's transaction, no committed state: undo what this step published before.

        Returns the ledger's new count (0); refuses when the rows cannot be told apart.
        """
        s = self.scope
        if self.mode != "upsert":
            if not self.own.may_discard():
                raise DataError(
                    f"table {self.table} holds {committed} published parts of run {s.run_id!r} step "
                    f"{s.step!r} mixed with other runs' rows, and this start has no checkpoint to "
                    f"resume from; segue cannot take those rows back: clean the table by hand or "
                    f"start a new run into a new table"
                )
            self.db.execute(f"DELETE FROM {self.table}")
        self.db.execute("UPDATE segue_sink_ledger SET committed = 0 WHERE run_id = ? AND step = ? "
                        "AND sink = ?", (s.run_id, s.step, self.table))
        return 0

    def write(self, records: Sequence[Any], shard: str, keys: Sequence[str] | None = None) -> None:
        cols = self.columns
        self._buf.extend(tuple(r[c] for c in cols) for r in records)

    def stage(self) -> None:
        if not self._buf:
            return
        part = self._next_part
        tag = self._tag(part)
        marks = ", ".join("?" for _ in range(len(self.columns) + 1))
        db = self.db
        with not_retried(f"table {self.table}"):
            db.begin()
            try:
                if not self._text:  # once per open: the staging table and its text columns
                    self._ensure_staging()
                text = self._text
                rows = [(*(as_text(v) if t else v for v, t in zip(row, text, strict=True)), tag)
                        for row in self._buf]
                db.executemany(f"INSERT INTO {self.staged_table} ({', '.join(self.columns)}, segue_tag) "
                               f"VALUES ({marks})", rows)
                db.commit()
            except BaseException:
                db.rollback()
                raise
        self._next_part += 1
        self._pending.append(part)
        self._buf = []

    def state(self) -> dict[str, Any]:
        s = self.scope
        return {"next_part": self._next_part, "pending": [{"part": p, "epoch": s.epoch} for p in self._pending]}

    def publish(self) -> None:
        if not self._pending:
            return
        s = self.scope
        with not_retried(f"table {self.table}"):
            try:
                committed = self._txn_fenced(advance=False)
                self._ensure_table()
                self.own.before_publish()
                self._publish_parts([(p, s.epoch) for p in self._pending], committed)
                self.db.commit()
            except BaseException:
                self.db.rollback()
                raise
        self._pending = []

    def finish(self) -> None:
        self.close()

    def close(self) -> None:
        self._own = None
        if self._db is not None:
            self._db.close()
            self._db = None

    def describe(self) -> str:
        return f"table {self.table}"
