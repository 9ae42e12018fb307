"""The hot writes of the PostgreSQL store, each one statement: one round trip.

A heartbeat, a controller's lease renewal, a run's transition and a task's (a move of
:mod:`segue.store.transitions`, rendered by :func:`task_move`) happen many times a
second across a cluster. Written as a transaction of their own (BEGIN, lock, clock,
write, event, COMMIT), each costs six round trips; here each is one statement in
autocommit, so it is its own transaction. The statement does what the locked path
(:class:`~segue.store.postgres.PostgresStore`'s ``_write`` bodies) does when the write
is allowed, in the same order:

1. ``cur``: lock the row the write is judged by (``FOR UPDATE`` / ``FOR NO KEY UPDATE``;
   a task's move locks its run's row, then the task's, as the locked path does);
2. ``ok``: the fence and the state check, on the locked (newest) version of the row;
3. ``clk``: the commit marker, stamped by the database's clock read after the lock
   (so a COMMIT whose answer is lost can be settled as in the locked path);
4. the write, and its event, only if ``ok`` holds.

The statement's answer is empty when the check fails, and then nothing was written:
the caller runs the locked path, which judges again and raises the same error (or
returns the same no-op) as it always did. The judgment therefore stays in one place,
in Python; these statements only take the common case in one trip.

Parameters are bound by name; ``offset`` is the test clock's offset (see ``Tx.now``).
"""

from __future__ import annotations

from typing import Any

from ..states import TaskState
from .postgres_schema import EVENTS_CHANNEL
from .records import EVENT_COLUMNS
from .transitions import TASK_COLUMNS, IfFrom, Move, Now, Old, Text, json_text

_CLOCK = "extract(epoch FROM clock_timestamp())::float8 + %(offset)s"

HEARTBEAT = f"""
WITH cur AS (SELECT epoch, state FROM tasks WHERE run_id = %(run_id)s AND step = %(step)s
             FOR UPDATE),
     ok AS (SELECT 1 FROM cur WHERE epoch = %(epoch)s AND state = 'RUNNING'),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM ok
             RETURNING at),
     upd AS (UPDATE tasks SET lease_until = clk.at + %(ttl_s)s, updated_at = clk.at FROM clk
             WHERE tasks.run_id = %(run_id)s AND tasks.step = %(step)s
             RETURNING tasks.lease_until)
SELECT upd.lease_until, (SELECT state FROM runs WHERE run_id = %(run_id)s) AS run_state
FROM upd"""
"""Extend a task's lease if ``epoch`` still holds it and it is RUNNING."""

RENEW_CONTROLLER = f"""
WITH cur AS (SELECT controller_epoch FROM runs WHERE run_id = %(run_id)s FOR NO KEY UPDATE),
     ok AS (SELECT 1 FROM cur WHERE controller_epoch = %(epoch)s),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM ok
             RETURNING at),
     upd AS (UPDATE runs SET controller_lease_until = clk.at + %(ttl_s)s, updated_at = clk.at
             FROM clk WHERE runs.run_id = %(run_id)s RETURNING runs.*)
SELECT * FROM upd"""
"""Extend a controller's lease if ``epoch`` still holds the run."""

TRANSITION_RUN = f"""
WITH cur AS (SELECT state, controller_epoch FROM runs WHERE run_id = %(run_id)s
             FOR NO KEY UPDATE),
     ok AS (SELECT state FROM cur WHERE state = ANY(%(sources)s)
            AND (%(controller_epoch)s::bigint IS NULL
                 OR controller_epoch = %(controller_epoch)s::bigint)),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM ok
             RETURNING at),
     upd AS (UPDATE runs SET state = %(to)s, updated_at = clk.at FROM clk
             WHERE runs.run_id = %(run_id)s RETURNING runs.*),
     ev AS (INSERT INTO events (run_id, step, time, actor, kind, from_state, to_state,
                                reason, data)
            SELECT upd.run_id, NULL, upd.updated_at, %(actor)s, 'run', ok.state, upd.state,
                   %(reason)s, '{{}}' FROM upd, ok
            RETURNING id, pg_notify('{EVENTS_CHANNEL}', run_id))
SELECT upd.* FROM upd, ev"""
"""Move a run to ``to`` if its state is one of ``sources`` (the legal ones, never ``to``
itself) and, when ``controller_epoch`` is given, that controller still holds it."""


# -- a task's moves (segue.store.transitions), rendered as one statement ----------------------
# A step's event notifies no listener: only agents wait (for runs), and a NOTIFY holds a
# cluster-wide lock from before its transaction's commit until after it is durable, which
# serialises every notifying commit (16 writers: 244 commits/s against 1,156 without).
_TASK_MOVE = f"""
WITH cur AS MATERIALIZED (
        SELECT t.* FROM runs r JOIN tasks t ON t.run_id = r.run_id
        WHERE r.run_id = %(run_id)s AND t.step = %(step)s
        FOR NO KEY UPDATE OF r FOR UPDATE OF t),
     ok AS (SELECT * FROM cur WHERE {{sources}}
            AND (%(epoch)s::bigint IS NULL OR epoch = %(epoch)s::bigint)),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM ok
             RETURNING at),
     upd AS (UPDATE tasks SET {{sets}} FROM clk, ok
             WHERE tasks.run_id = %(run_id)s AND tasks.step = %(step)s RETURNING tasks.*),
     ev AS (INSERT INTO events ({EVENT_COLUMNS})
            SELECT %(run_id)s, %(step)s, clk.at, %(actor)s, {{kind}}, {{frm}}, {{to}}, {{reason}},
                   {{data}}
            FROM clk, ok, upd
            RETURNING id)
SELECT upd.* FROM upd, ev"""


class _Params:
    """Binds a statement's values by name, in the order rendered, so the same move
    gives the same text (psycopg prepares it once it repeats). What the code decides
    (states, counts, a lease's length, nulls) is written into the text instead: fewer
    values to send, no arrays."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def bind(self, v: Any, cast: str = "") -> str:
        name = f"v{len(self.values)}"
        self.values[name] = v
        return f"%({name})s{cast}"

    def expr(self, v: Any, cast: str = "") -> str:
        """SQL for a change's value: the locked row's old values are ``ok``'s, the
        write's time is ``clk.at`` (the database's clock plus the test offset)."""
        if isinstance(v, Now):
            return f"(clk.at + {_number(v.plus)}::float8)" if v.plus else "clk.at"
        if isinstance(v, Old):
            col = f"ok.{_column(v.col)}"
            if v.plus:
                col = f"({col} + {_number(v.plus)})"
            return col if v.default is None else f"COALESCE({col}, {self.expr(v.default, cast)})"
        if isinstance(v, Text):
            return "concat(" + ", ".join(self.expr(p, "::text") for p in v.parts) + ")"
        if v is None:
            return "NULL" + cast
        return self.bind(v, cast)


def _number(v: float) -> str:
    """A number the code chose (a count, a lease's length), as an SQL literal."""
    if not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {v!r}")
    return repr(v)


def _state(state: str) -> str:
    """A task state as an SQL literal (a name of the table, never a caller's text)."""
    if state not in _TASK_STATES:
        raise ValueError(f"not a task state: {state!r}")
    return f"'{state}'"


def _states(states: frozenset[str], col: str = "ok.state") -> str:
    """``col IN (…)``; false for no state."""
    return f"{col} IN ({', '.join(_state(x) for x in sorted(states))})" if states else "false"


_TASK_STATES = frozenset(s.value for s in TaskState)


def _column(name: str) -> str:
    if name not in TASK_COLUMNS:  # names are formatted into SQL: the fixed set only
        raise ValueError(f"not a task column: {name!r}")
    return name


def task_move(move: Move, *, run_id: str, step: str, epoch: int | None) -> tuple[str, dict[str, Any]]:
    """One statement for ``move`` of a task (the run's row locked first, then the task's,
    as in the locked path): it writes only if the task's state is one of the move's
    sources and, when ``epoch`` is given, that attempt still holds it."""
    p = _Params()
    sets = []
    for col, v in move.changes.items():
        if isinstance(v, IfFrom):
            sets.append(f"{_column(col)} = CASE WHEN {_states(v.states)}"
                        f" THEN {p.expr(v.value)} ELSE ok.{col} END")
        elif col == "state":
            sets.append(f"state = {_state(v)}")
        else:
            sets.append(f"{_column(col)} = {p.expr(v)}")
    ev = move.event
    if ev.kind != "task":
        raise ValueError(f"not a task's move: {ev.kind!r}")
    sql = _TASK_MOVE.format(sources=_states(move.sources, "state"),
                            sets=", ".join(sets), kind="'task'", frm=p.expr(ev.from_state, "::text"),
                            to=_state(ev.to_state), reason=p.expr(ev.reason, "::text"),
                            data=p.expr(json_text(ev.data), "::text"))
    return sql, {**p.values, "run_id": run_id, "step": step, "epoch": epoch, "actor": ev.actor}
