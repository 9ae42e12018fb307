"""The notification outbox of a home: which events each webhook still has to receive.

Deliveries are derived from the event log, never written beside it: every
transition is already an event committed with the change itself, so a pump
reads the events after each hook's cursor, queues the ones the hook wants
(one row per event and hook, the event id being the delivery id) and moves
the cursor, in one transaction. Nothing that writes events needs to know
about webhooks, and an event cannot be lost between its commit and the queue.

A cursor is a *commit position*: a reader that has consumed every event up
to it never finds a new event at or below it. Here that is the event id,
because SQLite serializes writers (``BEGIN IMMEDIATE``): a reader that sees
event N sees every event before it. PostgreSQL commits concurrently, so an
id drawn earlier can commit later; there the position is the writing
transaction's id, read only below the oldest transaction still running
(:mod:`segue.store.postgres_outbox`). Either way the delivery id stays the
event id.

A delivery is *claimed* (status ``sending``, with an owner and a lease) by a
conditional update before it is sent, so two pumps (a controller and the
server, say) never send the same delivery at the same time; a pump that died
mid-send leaves a lease that expires, and the delivery is sent again
(at-least-once: receivers dedupe on the delivery id). Settling is conditional
on the claim, so a pump whose lease was taken over cannot overwrite the
newer outcome.

This module owns the SQL only: what a hook wants, and how to send, belong to
:mod:`segue.notify`.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Clock, now
from .migrations import connect
from .sqlite_rows import PerThreadConnection

STATUSES = ("pending", "sending", "delivered", "failed")


@dataclass(frozen=True)
class RunEvent:
    """A run transition, as a pump matches it against the hooks."""

    id: int
    run_id: str
    flow: str
    step: str | None
    time: float
    actor: str
    from_state: str | None
    to_state: str | None
    reason: str
    data: dict[str, Any]
    pos: int  # its commit position: a cursor that consumed it may move here (SQLite: the id)


@dataclass(frozen=True)
class Delivery:
    event_id: int
    hook_id: str
    run_id: str
    event: str  # the notification's name: failed, paused, ...
    body: str  # the exact bytes sent (UTF-8 JSON), the same on every attempt
    status: str
    attempts: int  # attempts claimed so far, this one included once claimed
    next_at: float
    lease_until: float | None
    claim: str | None
    last_error: str | None
    created_at: float
    updated_at: float


class SQLiteOutbox(PerThreadConnection):
    """The outbox tables of one home's ``segue.db`` (schema version 3 and later)."""

    def __init__(self, path: str | Path, *, clock: Clock = now) -> None:
        self.path = Path(path)
        self._clock = clock
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"SQLiteOutbox({str(self.path)!r})"

    def _open(self) -> sqlite3.Connection:
        return connect(self.path)  # an older home is migrated here

    def _tx(self, conn: sqlite3.Connection, immediate: bool) -> _Tx:
        return _Tx(conn, immediate)

    def now(self) -> float:
        """The clock deliveries are timed by (next_at, leases)."""
        return self._clock()

    # -- hooks -----------------------------------------------------------------
    def start_hook(self, hook_id: str) -> int:
        """Give a new hook a cursor at the end of the log (it gets no backlog); returns it.

        A hook that has a cursor keeps it.
        """
        conn = self._conn()
        with self._tx(conn, immediate=True):
            conn.execute(
                "INSERT OR IGNORE INTO notify_cursors (hook_id, after_event)"
                " SELECT ?, COALESCE(MAX(id), 0) FROM events", (hook_id,))
            return int(conn.execute("SELECT after_event FROM notify_cursors WHERE hook_id = ?",
                                    (hook_id,)).fetchone()[0])

    def drop_hook(self, hook_id: str) -> int:
        """Forget a removed hook: its cursor and every delivery of it; returns how many."""
        conn = self._conn()
        with self._tx(conn, immediate=True):
            conn.execute("DELETE FROM notify_cursors WHERE hook_id = ?", (hook_id,))
            return conn.execute("DELETE FROM notify_outbox WHERE hook_id = ?", (hook_id,)).rowcount

    def cursors(self, hook_ids: Iterable[str]) -> dict[str, int]:
        """The cursor of each hook; a hook without one gets one now (see start_hook)."""
        ids = list(hook_ids)
        conn = self._conn()
        with self._tx(conn, immediate=False):
            rows = dict(conn.execute("SELECT hook_id, after_event FROM notify_cursors").fetchall())
        missing = [h for h in ids if h not in rows]
        for h in missing:
            rows[h] = self.start_hook(h)
        return {h: int(rows[h]) for h in ids}

    # -- queueing --------------------------------------------------------------
    def last_position(self) -> int:
        """The newest event's commit position, its id (0 for none): a pump with nothing
        new to read stops here."""
        conn = self._conn()
        with self._tx(conn, immediate=False):
            return int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])

    def run_events(self, after: int, *, limit: int = 1000) -> tuple[int, list[RunEvent]]:
        """Run transitions at commit positions (ids) > ``after``; and how far they
        cover the log.

        The second value is the position up to which the log was read: the last
        event when fewer than ``limit`` transitions followed ``after``, else the
        last transition returned (the caller reads on from there).
        """
        conn = self._conn()
        with self._tx(conn, immediate=False):
            hi = int(conn.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0])
            rows = conn.execute(
                "SELECT e.id, e.run_id, r.flow_name, e.step, e.time, e.actor, e.from_state,"
                " e.to_state, e.reason, e.data FROM events e JOIN runs r ON r.run_id = e.run_id"
                " WHERE e.id > ? AND e.id <= ? AND e.kind = 'run' AND e.to_state IS NOT NULL"
                " ORDER BY e.id LIMIT ?", (after, hi, limit)).fetchall()
        events = [RunEvent(id=r[0], run_id=r[1], flow=r[2], step=r[3], time=r[4], actor=r[5],
                           from_state=r[6], to_state=r[7], reason=r[8], data=json.loads(r[9]),
                           pos=r[0])
                  for r in rows]
        upto = events[-1].id if len(events) == limit else hi
        return upto, events

    def enqueue(self, hook_id: str, items: Iterable[tuple[int, str, str, str]], *, upto: int) -> int:
        """Queue ``(event_id, run_id, event, body)`` for the hook and move its cursor to
        the position ``upto``, in one transaction; returns how many were new.

        Idempotent: an item queued already (by a racing pump) is left as it is, and
        the cursor never moves back.
        """
        t = self._clock()
        conn = self._conn()
        with self._tx(conn, immediate=True):
            n = 0
            for event_id, run_id, event, body in items:
                n += conn.execute(
                    "INSERT OR IGNORE INTO notify_outbox (event_id, hook_id, run_id, event, body,"
                    " status, attempts, next_at, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?, 'pending', 0, ?, ?, ?)",
                    (event_id, hook_id, run_id, event, body, t, t, t)).rowcount
            conn.execute(
                "INSERT INTO notify_cursors (hook_id, after_event) VALUES (?, ?)"
                " ON CONFLICT (hook_id) DO UPDATE SET"
                " after_event = MAX(notify_cursors.after_event, excluded.after_event)",
                (hook_id, upto))
            return n

    # -- sending ---------------------------------------------------------------
    def due(self, *, limit: int = 50) -> list[Delivery]:
        """Deliveries that may be claimed now: pending and due, or sending with an expired lease."""
        t = self._clock()
        conn = self._conn()
        with self._tx(conn, immediate=False):
            rows = conn.execute(
                "SELECT * FROM notify_outbox WHERE status = 'pending' AND next_at <= ?"
                " UNION ALL SELECT * FROM notify_outbox WHERE status = 'sending' AND lease_until <= ?"
                " ORDER BY event_id LIMIT ?", (t, t, limit)).fetchall()
        return [_delivery(r) for r in rows]

    def claim(self, event_id: int, hook_id: str, *, owner: str, lease_s: float) -> Delivery | None:
        """Take a due delivery for sending (attempts += 1); None if another pump has it
        or it is not due any more. The update's condition is the whole claim."""
        t = self._clock()
        conn = self._conn()
        with self._tx(conn, immediate=True):
            got = conn.execute(
                "UPDATE notify_outbox SET status = 'sending', claim = ?, lease_until = ?,"
                " attempts = attempts + 1, updated_at = ?"
                " WHERE event_id = ? AND hook_id = ? AND ((status = 'pending' AND next_at <= ?)"
                " OR (status = 'sending' AND lease_until <= ?))",
                (owner, t + lease_s, t, event_id, hook_id, t, t)).rowcount
            if not got:
                return None
            return _delivery(conn.execute(
                "SELECT * FROM notify_outbox WHERE event_id = ? AND hook_id = ?",
                (event_id, hook_id)).fetchone())

    def settle(self, event_id: int, hook_id: str, *, owner: str, status: str,
               next_at: float | None = None, error: str | None = None) -> bool:
        """Record how a claimed attempt ended: ``delivered``, ``failed`` (for good) or
        ``pending`` again at ``next_at``. False if the claim was lost meanwhile."""
        if status not in ("pending", "delivered", "failed"):
            raise ValueError(f"a delivery settles as pending, delivered or failed, not {status!r}")
        t = self._clock()
        conn = self._conn()
        with self._tx(conn, immediate=True):
            return bool(conn.execute(
                "UPDATE notify_outbox SET status = ?, next_at = ?, lease_until = NULL, claim = NULL,"
                " last_error = ?, updated_at = ? WHERE event_id = ? AND hook_id = ?"
                " AND status = 'sending' AND claim = ?",
                (status, t if next_at is None else next_at, error, t, event_id, hook_id,
                 owner)).rowcount)

    # -- reading ---------------------------------------------------------------
    def next_due(self) -> float | None:
        """When the earliest pending delivery (or sending lease) falls due; None if none."""
        conn = self._conn()
        with self._tx(conn, immediate=False):
            a = conn.execute("SELECT MIN(next_at) FROM notify_outbox WHERE status = 'pending'"
                             ).fetchone()[0]
            b = conn.execute("SELECT MIN(lease_until) FROM notify_outbox WHERE status = 'sending'"
                             ).fetchone()[0]
        found = [x for x in (a, b) if x is not None]
        return min(found) if found else None

    def counts(self) -> dict[tuple[str, str], int]:
        """(hook, status) -> deliveries."""
        conn = self._conn()
        with self._tx(conn, immediate=False):
            rows = conn.execute("SELECT hook_id, status, COUNT(*) FROM notify_outbox"
                                " GROUP BY hook_id, status").fetchall()
        return {(r[0], r[1]): int(r[2]) for r in rows}

    def deliveries(self, *, hook_id: str | None = None, run_id: str | None = None,
                   limit: int = 100) -> list[Delivery]:
        """Newest first."""
        sql, args = "SELECT * FROM notify_outbox WHERE 1 = 1", list[Any]()
        if hook_id is not None:
            sql += " AND hook_id = ?"
            args.append(hook_id)
        if run_id is not None:
            sql += " AND run_id = ?"
            args.append(run_id)
        conn = self._conn()
        with self._tx(conn, immediate=False):
            rows = conn.execute(sql + " ORDER BY event_id DESC, hook_id LIMIT ?",
                                (*args, limit)).fetchall()
        return [_delivery(r) for r in rows]

    def forget_delivered(self, *, older_than_s: float) -> int:
        """Delete delivered rows settled more than ``older_than_s`` ago (the log keeps the events)."""
        conn = self._conn()
        with self._tx(conn, immediate=True):
            return conn.execute("DELETE FROM notify_outbox WHERE status = 'delivered'"
                                " AND updated_at < ?", (self._clock() - older_than_s,)).rowcount


class _Tx:
    """A transaction that commits on success and rolls back on any error."""

    def __init__(self, conn: sqlite3.Connection, immediate: bool) -> None:
        self.conn, self.immediate = conn, immediate

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE" if self.immediate else "BEGIN")
        return self.conn

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        if not self.conn.in_transaction:
            return
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


def _delivery(r: sqlite3.Row) -> Delivery:
    return Delivery(
        event_id=r["event_id"], hook_id=r["hook_id"], run_id=r["run_id"], event=r["event"],
        body=r["body"], status=r["status"], attempts=r["attempts"], next_at=r["next_at"],
        lease_until=r["lease_until"], claim=r["claim"], last_error=r["last_error"],
        created_at=r["created_at"], updated_at=r["updated_at"],
    )
