"""The webhook outbox on PostgreSQL, and the commit-position cursor over every run's events.

Same interface and semantics as :class:`~segue.store.outbox.SQLiteOutbox`
(read its docstring first); what differs is the cursor. PostgreSQL commits
writers concurrently and draws event ids under each run's row lock, so run
A's event 10 can commit after a reader already saw run B's event 11: paging
by id would skip event 10 for ever. So every event records the id of the
transaction that wrote it (``events.xid``, schema version 5), and a reader:

- reads only events whose ``xid`` is below ``pg_snapshot_xmin(pg_current_snapshot())``:
  every transaction below that line has ended, so no event can appear there later;
- reads them in ``(xid, id)`` order, and never splits one transaction's
  events across two pages;
- keeps as its cursor the xid up to which it consumed every event (a bigint:
  ``xid::text::bigint``), its *commit position*.

Event ids remain the delivery ids. A transaction left open holds the line
back, and deliveries wait until it ends (segue's own sessions are ended by
the server after ``IDLE_IN_TX_TIMEOUT_S``).

Writes go through :meth:`PostgresStore._write` (retries, commit markers, the
database's clock via :meth:`Tx.now`); reads through ``_read``. Bound parameters only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from .base import Clock
from .outbox import Delivery, RunEvent, _delivery
from .postgres_schema import Row, Tx, value

if TYPE_CHECKING:
    from .postgres import PostgresStore

# The newest commit position a reader may consume: the xid of the newest event
# written by a transaction below the line (0 for none).
LAST_POSITION_SQL = (
    "SELECT COALESCE((SELECT xid::text::bigint FROM events"
    " WHERE xid < pg_snapshot_xmin(pg_current_snapshot()) ORDER BY xid DESC LIMIT 1), 0) AS pos")
# In a write transaction: its own xid, which assigns it. Every xid assigned later is
# higher, so no event written from now on lands at or below it. (A snapshot's xmax
# is not that: it is the newest *completed* xid plus one, below xids still running.)
NEXT_POSITION_SQL = "SELECT pg_current_xact_id()::text::bigint AS pos"


def _exec(tx: Tx, sql: str, args: tuple[Any, ...]) -> None:
    """A statement that returns no rows, in the caller's transaction."""
    tx.conn.execute(sql, args)  # type: ignore[arg-type]  # fixed SQL text of this module


def last_position(tx: Tx) -> int:
    return int(value(tx.one(LAST_POSITION_SQL)))


def page_events(tx: Tx, select: str, args: tuple[Any, ...], after: int, upto: int,
                limit: int) -> tuple[list[Row], bool]:
    """The rows of ``select`` (over ``events e``, ending in a WHERE clause, selecting
    ``e.xid::text::bigint AS pos`` and ``e.id AS id``) with ``after < pos <= upto``, in
    (xid, id) order: ``limit`` of them, plus the rest of the last one's transaction.
    The flag says the page was full (the caller reads on from the last row's pos).

    ``upto`` must come from :func:`last_position` (below the line), or be lower."""
    rows = tx.all(select + " AND e.xid > %s::text::xid8 AND e.xid <= %s::text::xid8"
                  " ORDER BY e.xid, e.id LIMIT %s", (*args, max(after, 0), max(upto, 0), limit))
    if len(rows) < limit or not rows:
        return rows, False
    last = rows[-1]
    rest = tx.all(select + " AND e.xid = %s::text::xid8 AND e.id > %s ORDER BY e.id",
                  (*args, last["pos"], last["id"]))
    return rows + rest, True


_RUN_EVENTS = (
    "SELECT e.xid::text::bigint AS pos, e.id AS id, e.run_id, r.flow_name, e.step, e.time,"
    " e.actor, e.from_state, e.to_state, e.reason, e.data"
    " FROM events e JOIN runs r ON r.run_id = e.run_id"
    " WHERE e.kind = 'run' AND e.to_state IS NOT NULL")


class PostgresOutbox:
    """The outbox tables of a PostgreSQL store (schema version 5 and later).

    ``clock``: times deliveries (tests); default the database's clock.
    """

    def __init__(self, store: PostgresStore, *, clock: Clock | None = None,
                 owns_store: bool = False) -> None:
        self.store = store
        self._clock = clock
        self._owns = owns_store

    def __repr__(self) -> str:
        return f"PostgresOutbox({self.store!r})"

    def close(self) -> None:
        if self._owns:
            self.store.close()

    def now(self) -> float:
        """The clock deliveries are timed by (next_at, leases)."""
        return self._clock() if self._clock is not None else self.store.now()

    def _t(self, tx: Tx) -> float:
        t = tx.now()  # also the transaction's commit marker
        return self._clock() if self._clock is not None else t

    # -- hooks -----------------------------------------------------------------
    def start_hook(self, hook_id: str) -> int:
        """Give a new hook a cursor past every transaction that has written so far (it
        gets no backlog; one still open counts as before it); returns it. A hook that
        has a cursor keeps it."""
        def body(tx: Tx) -> int:
            _exec(tx, "INSERT INTO notify_cursors (hook_id, after_xid) SELECT %s, pos FROM ("
                   + NEXT_POSITION_SQL + ") n ON CONFLICT (hook_id) DO NOTHING", (hook_id,))
            return int(value(tx.one("SELECT after_xid FROM notify_cursors WHERE hook_id = %s",
                                    (hook_id,))))

        return self.store._write(body)

    def drop_hook(self, hook_id: str) -> int:
        """Forget a removed hook: its cursor and every delivery of it; returns how many."""
        def body(tx: Tx) -> int:
            _exec(tx, "DELETE FROM notify_cursors WHERE hook_id = %s", (hook_id,))
            return len(tx.all("DELETE FROM notify_outbox WHERE hook_id = %s RETURNING event_id",
                              (hook_id,)))

        return self.store._write(body)

    def cursors(self, hook_ids: Iterable[str]) -> dict[str, int]:
        """The cursor of each hook; a hook without one gets one now (see start_hook)."""
        ids = list(hook_ids)
        rows = {r["hook_id"]: int(r["after_xid"]) for r in self.store._read(
            lambda tx: tx.all("SELECT hook_id, after_xid FROM notify_cursors"))}
        for h in ids:
            if h not in rows:
                rows[h] = self.start_hook(h)
        return {h: rows[h] for h in ids}

    # -- queueing --------------------------------------------------------------
    def last_position(self) -> int:
        """The commit position of the newest event a reader may consume (0 for none):
        a pump with nothing new to read stops here."""
        return self.store._read(last_position)

    def run_events(self, after: int, *, limit: int = 1000) -> tuple[int, list[RunEvent]]:
        """Run transitions at commit positions > ``after``; and the position up to which
        the log was read: :meth:`last_position` when the page was not full, else the
        last transition's (whose transaction the page holds whole)."""
        def body(tx: Tx) -> tuple[int, list[Row], bool]:
            hi = last_position(tx)
            rows, full = page_events(tx, _RUN_EVENTS, (), after, hi, limit)
            return hi, rows, full

        hi, rows, full = self.store._read(body)
        events = [RunEvent(id=int(r["id"]), run_id=r["run_id"], flow=r["flow_name"], step=r["step"],
                           time=r["time"], actor=r["actor"], from_state=r["from_state"],
                           to_state=r["to_state"], reason=r["reason"], data=json.loads(r["data"]),
                           pos=int(r["pos"])) for r in rows]
        return (events[-1].pos if full else hi), events

    def enqueue(self, hook_id: str, items: Iterable[tuple[int, str, str, str]], *, upto: int) -> int:
        """Queue ``(event_id, run_id, event, body)`` for the hook and move its cursor to
        the position ``upto``, in one transaction; returns how many were new.

        Idempotent: an item queued already (by a racing pump) is left as it is, and
        the cursor never moves back.
        """
        rows = list(items)
        cols = [list(c) for c in zip(*rows, strict=True)] if rows else [[], [], [], []]

        def body(tx: Tx) -> int:
            t = self._t(tx)
            new = tx.all(
                "INSERT INTO notify_outbox (event_id, hook_id, run_id, event, body, status,"
                " attempts, next_at, created_at, updated_at)"
                " SELECT i.event_id, %s, i.run_id, i.event, i.body, 'pending', 0, %s, %s, %s"
                " FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::text[])"
                " AS i (event_id, run_id, event, body)"
                " ON CONFLICT (event_id, hook_id) DO NOTHING RETURNING event_id",
                (hook_id, t, t, t, *cols))
            _exec(tx, "INSERT INTO notify_cursors (hook_id, after_xid) VALUES (%s, %s)"
                   " ON CONFLICT (hook_id) DO UPDATE SET"
                   " after_xid = GREATEST(notify_cursors.after_xid, excluded.after_xid)",
                   (hook_id, upto))
            return len(new)

        return self.store._write(body)

    # -- sending ---------------------------------------------------------------
    def due(self, *, limit: int = 50) -> list[Delivery]:
        """Deliveries that may be claimed now: pending and due, or sending with an expired lease."""
        t = self.now()
        rows = self.store._read(lambda tx: tx.all(
            "SELECT * FROM notify_outbox WHERE status = 'pending' AND next_at <= %s"
            " UNION ALL SELECT * FROM notify_outbox WHERE status = 'sending' AND lease_until <= %s"
            " ORDER BY event_id LIMIT %s", (t, t, limit)))
        return [_delivery(cast(Any, r)) for r in rows]

    def claim(self, event_id: int, hook_id: str, *, owner: str, lease_s: float) -> Delivery | None:
        """Take a due delivery for sending (attempts += 1); None if another pump has it
        or it is not due any more. The row is locked before the clock is read."""
        def body(tx: Tx) -> Delivery | None:
            if tx.one("SELECT 1 FROM notify_outbox WHERE event_id = %s AND hook_id = %s"
                      " FOR UPDATE", (event_id, hook_id)) is None:
                return None
            t = self._t(tx)
            row = tx.one(
                "UPDATE notify_outbox SET status = 'sending', claim = %s, lease_until = %s,"
                " attempts = attempts + 1, updated_at = %s"
                " WHERE event_id = %s AND hook_id = %s AND ((status = 'pending' AND next_at <= %s)"
                " OR (status = 'sending' AND lease_until <= %s)) RETURNING *",
                (owner, t + lease_s, t, event_id, hook_id, t, t))
            return None if row is None else _delivery(cast(Any, row))

        return self.store._write(body)

    def settle(self, event_id: int, hook_id: str, *, owner: str, status: str,
               next_at: float | None = None, error: str | None = None) -> bool:
        """Record how a claimed attempt ended: ``delivered``, ``failed`` (for good) or
        ``pending`` again at ``next_at``. False if the claim was lost meanwhile."""
        if status not in ("pending", "delivered", "failed"):
            raise ValueError(f"a delivery settles as pending, delivered or failed, not {status!r}")

        def body(tx: Tx) -> bool:
            t = self._t(tx)
            return tx.one(
                "UPDATE notify_outbox SET status = %s, next_at = %s, lease_until = NULL,"
                " claim = NULL, last_error = %s, updated_at = %s WHERE event_id = %s"
                " AND hook_id = %s AND status = 'sending' AND claim = %s RETURNING event_id",
                (status, t if next_at is None else next_at, error, t, event_id, hook_id,
                 owner)) is not None

        return self.store._write(body)

    # -- reading ---------------------------------------------------------------
    def next_due(self) -> float | None:
        """When the earliest pending delivery (or sending lease) falls due; None if none."""
        row = self.store._read(lambda tx: tx.one(
            "SELECT LEAST((SELECT MIN(next_at) FROM notify_outbox WHERE status = 'pending'),"
            " (SELECT MIN(lease_until) FROM notify_outbox WHERE status = 'sending')) AS t"))
        t = value(row)
        return None if t is None else float(t)

    def counts(self) -> dict[tuple[str, str], int]:
        """(hook, status) -> deliveries."""
        rows = self.store._read(lambda tx: tx.all(
            "SELECT hook_id, status, COUNT(*) AS n FROM notify_outbox GROUP BY hook_id, status"))
        return {(r["hook_id"], r["status"]): int(r["n"]) for r in rows}

    def deliveries(self, *, hook_id: str | None = None, run_id: str | None = None,
                   limit: int = 100) -> list[Delivery]:
        """Newest first."""
        rows = self.store._read(lambda tx: tx.all(
            "SELECT * FROM notify_outbox WHERE (%s::text IS NULL OR hook_id = %s)"
            " AND (%s::text IS NULL OR run_id = %s) ORDER BY event_id DESC, hook_id LIMIT %s",
            (hook_id, hook_id, run_id, run_id, limit)))
        return [_delivery(cast(Any, r)) for r in rows]

    def forget_delivered(self, *, older_than_s: float) -> int:
        """Delete delivered rows settled more than ``older_than_s`` ago (the log keeps the events)."""
        def body(tx: Tx) -> int:
            return len(tx.all("DELETE FROM notify_outbox WHERE status = 'delivered'"
                              " AND updated_at < %s RETURNING event_id",
                              (self._t(tx) - older_than_s,)))

        return self.store._write(body)
