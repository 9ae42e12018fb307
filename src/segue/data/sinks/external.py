"""An external-call sink: one call per record, with an idempotency key and a dedup ledger.

Each record's idempotency key is ``RUN/STEP/RECORD_KEY``; the record key comes
from ``key(record)`` or, by default, from where the record came from (shard
and ordinal), so no id column is needed. The ledger (a SQLite file) holds
each staged call (key, payload, ``staged``/``sent``). Calls are made only
after the checkpoint covering them commits; a call whose ledger row says
``sent`` is skipped, and one interrupted between the call and the ledger
update is sent again *with the same key*, so a receiver that deduplicates on
the key sees it once. Publishing is fenced on the ledger's epoch.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import FencedError
from .base import Scope, Sink

MARK_EVERY = 64
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS calls (idem_key TEXT PRIMARY KEY, scope TEXT NOT NULL, tag TEXT NOT NULL, "
    "payload TEXT NOT NULL, status TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS calls_tag ON calls (tag, status)",
    "CREATE TABLE IF NOT EXISTS fence (scope TEXT PRIMARY KEY, epoch INTEGER NOT NULL)",
)


class ExternalCallSink(Sink):
    """``call(record, idempotency_key)`` once per record, exactly once from the ledger's view."""

    needs_keys = True

    def __init__(self, call: Callable[[Any, str], Any], ledger: str, *,
                 key: Callable[[Any], str] | None = None) -> None:
        self.call = call
        self.ledger = ledger
        self.key = key
        self._conn: sqlite3.Connection | None = None
        self._scope: Scope | None = None
        self._buf: list[tuple[str, str]] = []
        self._next_part = 0
        self._pending: list[int] = []
        self.calls_made = 0
        self.calls_skipped = 0

    @property
    def scope(self) -> Scope:
        if self._scope is None:
            raise RuntimeError("sink used before open()")
        return self._scope

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = sqlite3.connect(self.ledger, timeout=30, isolation_level=None)
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            for ddl in SCHEMA:
                self._conn.execute(ddl)
        return self._conn

    def _tag(self, part: int, epoch: int) -> str:
        return f"{self.scope.prefix}e{epoch}/p{part:08d}"

    def _fenced(self, advance: bool) -> None:
        """Inside BEGIN IMMEDIATE: refuse a stale epoch; optionally take ownership."""
        s, c = self.scope, self.conn
        row = c.execute("SELECT epoch FROM fence WHERE scope = ?", (s.prefix,)).fetchone()
        if row is not None and row[0] > s.epoch:
            c.execute("ROLLBACK")
            raise FencedError(f"calls from epoch {s.epoch} rejected: epoch {row[0]} owns "
                              f"{s.prefix} in {self.ledger}; this attempt must stop")
        if advance:
            c.execute("INSERT INTO fence VALUES (?, ?) ON CONFLICT (scope) DO UPDATE SET epoch = excluded.epoch",
                      (s.prefix, s.epoch))

    def _send(self, tags: list[str]) -> None:
        """Make the staged calls of ``tags``, fenced once per part, marking them sent as we go.

        Sent marks are written every MARK_EVERY calls: a crash re-sends at most
        that many calls, each with its original key.
        """
        c = self.conn
        for tag in tags:
            c.execute("BEGIN IMMEDIATE")
            self._fenced(advance=False)
            c.execute("COMMIT")
            rows = c.execute("SELECT idem_key, payload FROM calls WHERE tag = ? AND status = 'staged' "
                             "ORDER BY rowid", (tag,)).fetchall()
            done: list[tuple[str]] = []
            for idem, payload in rows:
                self.call(json.loads(payload), idem)
                done.append((idem,))
                self.calls_made += 1
                if len(done) >= MARK_EVERY:
                    self._mark(done)
                    done = []
            self._mark(done)

    def _mark(self, keys: list[tuple[str]]) -> None:
        if keys:
            c = self.conn
            c.execute("BEGIN IMMEDIATE")
            c.executemany("UPDATE calls SET status = 'sent' WHERE idem_key = ?", keys)
            c.execute("COMMIT")

    def open(self, scope: Scope, state: dict[str, Any] | None) -> None:
        self._scope = scope
        c = self.conn
        keep = [] if state is None else [self._tag(p["part"], p["epoch"]) for p in state["pending"]]
        c.execute("BEGIN IMMEDIATE")
        try:
            self._fenced(advance=True)
            c.execute("DELETE FROM calls WHERE scope = ? AND status = 'staged'"
                      + "".join(" AND tag <> ?" for _ in keep), (scope.prefix, *keep))
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self._send(keep)  # roll forward: same keys as before the crash
        self._next_part = 0 if state is None else int(state["next_part"])
        self._pending = []

    def write(self, records: Sequence[Any], shard: str, keys: Sequence[str] | None = None) -> None:
        prefix = self.scope.prefix
        if self.key is not None:
            keys = [self.key(r) for r in records]
        if keys is None or len(keys) != len(records):
            raise ValueError("the external-call sink needs one key per record")
        self._buf.extend((prefix + k, json.dumps(r)) for k, r in zip(keys, records, strict=True))

    def stage(self) -> None:
        if not self._buf:
            return
        s, c = self.scope, self.conn
        part = self._next_part
        tag = self._tag(part, s.epoch)
        c.execute("BEGIN IMMEDIATE")
        try:
            self._fenced(advance=False)
            # OR IGNORE: a key already sent (output redone after a restore) stays sent and is skipped.
            cur = c.executemany("INSERT OR IGNORE INTO calls VALUES (?, ?, ?, ?, 'staged')",
                                [(k, s.prefix, tag, p) for k, p in self._buf])
            self.calls_skipped += len(self._buf) - max(cur.rowcount, 0)
            c.execute("COMMIT")
        except BaseException:
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        self._next_part += 1
        self._pending.append(part)
        self._buf = []

    def state(self) -> dict[str, Any]:
        return {"next_part": self._next_part,
                "pending": [{"part": p, "epoch": self.scope.epoch} for p in self._pending]}

    def publish(self) -> None:
        if not self._pending:
            return
        c = self.conn
        c.execute("BEGIN IMMEDIATE")
        self._fenced(advance=False)  # refuse a zombie even when nothing is left to send
        c.execute("COMMIT")
        self._send([self._tag(p, self.scope.epoch) for p in self._pending])
        self._pending = []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def finish(self) -> None:
        self.close()

    def describe(self) -> str:
        return f"external calls (ledger {self.ledger})"
