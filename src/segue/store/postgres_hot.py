"""The hot writes of the PostgreSQL store, each one statement: one round trip.

A heartbeat, a controller's lease renewal, a run's transition and a task's (a move of
:mod:`segue.store.transitions`, rendered by :func:`task_move`), an attempt's process,
its progress, an event and a new run happen many times a second across a cluster. Written as a transaction of their own (BEGIN, lock, clock,
write, event, COMMIT), each costs six round trips; here each is one statement in
autocommit, so it is its own transaction. The statement does what the locked path
(:class:`~segue.store.postgres.PostgresStore`'s ``_write`` bodies) does when the write
is allowed, in the same order:

1. ``cur``: lock the row the write is judged by (``FOR UPDATE`` / ``FOR NO KEY UPDATE``;
   a task's move locks its run's row, then the task's, as the locked path does);
2. ``ok``: the fence and the state check, on the locked (newest) version of the row
   (or in ``cur``'s own condition: a row lock waits for a concurrent writer and then
   checks the condition again on the newest version);
3. ``clk``: the commit marker, stamped by the database's clock read after the lock
   (so a COMMIT whose answer is lost can be settled as in the locked path);
4. the write, and its event, only if ``ok`` holds.

The statement's answer is empty when the check fails, and then nothing was written:
the caller runs the locked path, which judges again and raises the same error (or
returns the same no-op) as it always did. The judgment therefore stays in one place,
in Python; these statements only take the common case in one trip.

Parameters are bound by name; ``offset`` is the test clock's offset (see ``Tx.now``).

A checkpoint's commit stays in the locked path: its seq check reads the step's newest
checkpoint, and a statement's snapshot is taken before its locks are waited for, so a
checkpoint committed meanwhile by the lock's holder would be invisible to it (a row it
locks is read in its newest version, a row inserted since is not read at all).
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


SET_ATTEMPT_PID = f"""
WITH cur AS (SELECT 1 FROM tasks WHERE run_id = %(run_id)s AND step = %(step)s
             AND epoch = %(epoch)s AND state = 'RUNNING' FOR UPDATE),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM cur
             RETURNING at)
UPDATE tasks SET pid = %(pid)s, host = %(host)s, updated_at = clk.at FROM clk
WHERE tasks.run_id = %(run_id)s AND tasks.step = %(step)s RETURNING clk.at"""
"""Record an attempt's process if ``epoch`` still holds the task and it is RUNNING. The
row lock waits for a concurrent writer and the check is made on the newest version."""

REPORT_PROGRESS = f"""
WITH cur AS (SELECT 1 FROM tasks WHERE run_id = %(run_id)s AND step = %(step)s
             AND epoch = %(epoch)s FOR UPDATE),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM cur
             RETURNING at)
UPDATE tasks SET progress_done = %(progress_done)s, progress_total = %(progress_total)s, updated_at = clk.at
FROM clk
WHERE tasks.run_id = %(run_id)s AND tasks.step = %(step)s RETURNING clk.at"""
"""Record a step's progress if ``epoch`` still holds the task."""

_APPEND_EVENT = f"""
WITH cur AS MATERIALIZED (
        SELECT r.run_id FROM runs r WHERE r.run_id = %(run_id)s
        AND (%(step)s::text IS NULL
             OR EXISTS (SELECT 1 FROM tasks t WHERE t.run_id = r.run_id AND t.step = %(step)s))
        FOR NO KEY UPDATE OF r),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM cur
             RETURNING at)
INSERT INTO events ({EVENT_COLUMNS})
SELECT %(run_id)s, %(step)s, clk.at, %(actor)s, %(kind)s, NULL, NULL, %(reason)s, %(data)s FROM clk
RETURNING id, time{{notify}}"""
APPEND_EVENT = _APPEND_EVENT.format(notify="")
"""Append a step's event under its run's row lock (which orders the run's event ids), if
the run and the step exist: tasks are never deleted, so one the statement's snapshot
misses (added since) only sends the write to the locked path."""
APPEND_RUN_EVENT = _APPEND_EVENT.format(notify=f", pg_notify('{EVENTS_CHANNEL}', run_id)")
"""The same for a run's own event, which notifies its listeners (see ``insert_event``)."""

CREATE_RUN = f"""
WITH clk AS MATERIALIZED (SELECT {_CLOCK} AS at),
     ins AS (INSERT INTO runs (run_id, flow_name, flow_path, params, fingerprint, options, state,
                               created_at, updated_at)
             SELECT %(run_id)s, %(flow_name)s, %(flow_path)s, %(params)s, %(fingerprint)s,
                    %(options)s, 'PENDING', clk.at, clk.at FROM clk
             ON CONFLICT (run_id) DO NOTHING RETURNING *),
     mark AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, ins.created_at FROM ins),
     tk AS (INSERT INTO tasks (run_id, step, ord, state, updated_at)
            SELECT ins.run_id, s.step, (s.n - 1)::integer, 'PENDING', ins.created_at
            FROM ins, unnest(%(steps)s::text[]) WITH ORDINALITY AS s(step, n)),
     ev AS (INSERT INTO events ({EVENT_COLUMNS})
            SELECT ins.run_id, NULL, ins.created_at, %(actor)s, 'run', NULL, 'PENDING',
                   'run created', %(data)s FROM ins
            RETURNING pg_notify('{EVENTS_CHANNEL}', run_id))
SELECT ins.* FROM ins, ev"""
"""Create a run, its tasks (PENDING, in order) and its event, unless the id is taken
(then nothing is written, not even the marker, and the locked path raises). The rows
are invisible to others until the statement commits: as good as locked."""

# -- a task's moves (segue.store.transitions), rendered as one statement ----------------------
# A step's event notifies no listener: only agents wait (for runs), and a NOTIFY holds a
# cluster-wide lock from before its transaction's commit until after it is durable, which
# serialises every notifying commit (16 writers: 244 commits/s against 1,156 without).
# ``cur`` locks the run's row, then the task's, and only where the task may make the move
# (its state one of the sources, its epoch the caller's): under READ COMMITTED the lock
# waits for a concurrent writer and then judges the newest version of both rows again,
# so the check is made on the locked row. It reads only the columns the move uses. The
# marker, the event and the update each take one row from ``cur`` (and ``clk``): all three
# are written, or (``cur`` empty) none. A data-modifying CTE runs whether read or not.
_TASK_MOVE = f"""
WITH cur AS MATERIALIZED (
        SELECT {{cols}} FROM runs r JOIN tasks t ON t.run_id = r.run_id
        WHERE r.run_id = %(run_id)s AND t.step = %(step)s AND {{sources}}
              AND (%(epoch)s::bigint IS NULL OR t.epoch = %(epoch)s::bigint)
        FOR NO KEY UPDATE OF r FOR UPDATE OF t),
     clk AS (INSERT INTO commit_markers (token, at) SELECT %(token)s, {_CLOCK} FROM cur
             RETURNING at),
     ev AS (INSERT INTO events ({EVENT_COLUMNS})
            SELECT %(run_id)s, %(step)s, clk.at, %(actor)s, {{kind}}, {{frm}}, {{to}}, {{reason}},
                   {{data}}
            FROM clk, cur ok)
UPDATE tasks SET {{sets}} FROM clk, cur ok
WHERE tasks.run_id = %(run_id)s AND tasks.step = %(step)s RETURNING tasks.*"""


class _Params:
    """Binds a statement's values by name. A value's name says where in the move it
    stands (``c_<column>``, ``from``, ``reason``, ``data``, a part ``_<i>`` of a text),
    never what it is, so moves of one shape share one text (rendered once, see
    :func:`task_move`; psycopg prepares it once it repeats). What the code decides
    (states, counts, a lease's length, nulls) is written into the text instead: fewer
    values to send, no arrays."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.cols: set[str] = {"state"}  # the old row's columns the statement reads

    def bind(self, v: Any, at: str, cast: str = "") -> str:
        self.values[at] = v
        return f"%({at})s{cast}"

    def expr(self, v: Any, at: str, cast: str = "") -> str:
        """SQL for a change's value: the locked row's old values are ``ok``'s, the
        write's time is ``clk.at`` (the database's clock plus the test offset)."""
        if isinstance(v, Now):
            return f"(clk.at + {_number(v.plus)}::float8)" if v.plus else "clk.at"
        if isinstance(v, Old):
            self.cols.add(_column(v.col))
            col = f"ok.{v.col}"
            if v.plus:
                col = f"({col} + {_number(v.plus)})"
            return col if v.default is None else f"COALESCE({col}, {self.expr(v.default, at + 'd', cast)})"
        if isinstance(v, Text):
            return "concat(" + ", ".join(self.expr(p, f"{at}_{i}", "::text")
                                         for i, p in enumerate(v.parts)) + ")"
        if v is None:
            return "NULL" + cast
        return self.bind(v, at, cast)


def _shape(v: Any, at: str, values: dict[str, Any]) -> Any:
    """What of ``v`` shapes the statement :meth:`_Params.expr` writes for it (hashable);
    its plain values go to ``values``, under the names ``expr`` binds them by."""
    if isinstance(v, Now):
        return ("now", v.plus)
    if isinstance(v, Old):
        return ("old", v.col, v.plus, None if v.default is None else _shape(v.default, at + "d", values))
    if isinstance(v, Text):
        return ("text", tuple(_shape(p, f"{at}_{i}", values) for i, p in enumerate(v.parts)))
    if v is None:
        return None
    values[at] = v
    return "$"


def _move_shape(move: Move, values: dict[str, Any]) -> Any:
    """The statement's text depends on this only (the sources, each change's column and
    shape, the event's); the plain values, which it binds, go to ``values``. The event's
    data is part of the shape as it is (its JSON text is written once per shape)."""
    changes: list[tuple[Any, ...]] = []
    for col, v in move.changes.items():
        if isinstance(v, IfFrom):
            changes.append((col, "if", v.states, _shape(v.value, f"c_{col}", values)))
        elif col == "state":
            changes.append((col, v))
        else:
            changes.append((col, _shape(v, f"c_{col}", values)))
    ev = move.event
    return (move.sources, tuple(changes), ev.kind, _shape(ev.from_state, "from", values), ev.to_state,
            _shape(ev.reason, "reason", values), tuple((k, _data_shape(v)) for k, v in ev.data.items()))


def _data_shape(v: Any) -> Any:
    """An event's data value as the shape holds it: an expression's shape, or the plain
    value itself with its type (its JSON text is part of the statement's; 1, 1.0 and
    True are equal in Python but not in JSON). TypeError for any other value."""
    if isinstance(v, (Now, Old, Text)):
        return _shape(v, "", {})
    if v is None or type(v) in (str, int, bool):
        return (type(v).__name__, v)
    if type(v) is float:  # -0.0 == 0.0
        return ("float", repr(v))
    raise TypeError(f"not kept by shape: {type(v).__name__}")


_RENDERED: dict[Any, tuple[str, dict[str, Any]]] = {}  # a move's shape: its text, its data's values
_RENDERED_MAX = 256


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


def _render(move: Move) -> tuple[str, dict[str, Any]]:
    p = _Params()
    sets = []
    for col, v in move.changes.items():
        if isinstance(v, IfFrom):
            p.cols.add(_column(col))
            sets.append(f"{_column(col)} = CASE WHEN {_states(v.states)}"
                        f" THEN {p.expr(v.value, f'c_{col}')} ELSE ok.{col} END")
        elif col == "state":
            sets.append(f"state = {_state(v)}")
        else:
            sets.append(f"{_column(col)} = {p.expr(v, f'c_{col}')}")
    ev = move.event
    if ev.kind != "task":
        raise ValueError(f"not a task's move: {ev.kind!r}")
    frm = p.expr(ev.from_state, "from", "::text")
    reason = p.expr(ev.reason, "reason", "::text")
    data = p.expr(json_text(ev.data), "data", "::text")
    sql = _TASK_MOVE.format(cols=", ".join(f"t.{c}" for c in sorted(p.cols)),
                            sources=_states(move.sources, "t.state"), sets=", ".join(sets),
                            kind="'task'", frm=frm, to=_state(ev.to_state), reason=reason, data=data)
    return sql, p.values


def render_move(move: Move) -> tuple[str, dict[str, Any]]:
    """The statement for ``move`` of a task and its values, but for those of the write
    (``run_id``, ``step``, ``epoch``, ``actor``: see :func:`task_move`).

    The text is rendered once per shape of move (:func:`_move_shape`) and kept: a
    controller's moves come in a few shapes, and rendering costs more than sending."""
    values: dict[str, Any] = {}
    try:
        shape = _move_shape(move, values)
        hit = _RENDERED.get(shape)
    except TypeError:  # a value in the event's data that is not a scalar: rendered every time
        shape, hit = None, None
    if hit is None:
        sql, rendered = _render(move)
        fixed = {k: v for k, v in rendered.items() if k.startswith("data")}
        if shape is not None and {k: v for k, v in rendered.items() if k not in fixed} == values:
            if len(_RENDERED) >= _RENDERED_MAX:
                _RENDERED.clear()
            _RENDERED[shape] = (sql, fixed)
        return sql, rendered
    sql, fixed = hit
    values.update(fixed)
    return sql, values


def move_params(move: Move, values: dict[str, Any], *, run_id: str, step: str,
                epoch: int | None) -> dict[str, Any]:
    """The values of :func:`render_move` with those of the write."""
    return {**values, "run_id": run_id, "step": step, "epoch": epoch, "actor": move.event.actor}


def task_move(move: Move, *, run_id: str, step: str, epoch: int | None) -> tuple[str, dict[str, Any]]:
    """One statement for ``move`` of a task (the run's row locked first, then the task's,
    as in the locked path): it writes only if the task's state is one of the move's
    sources and, when ``epoch`` is given, that attempt still holds it."""
    sql, values = render_move(move)
    return sql, move_params(move, values, run_id=run_id, step=step, epoch=epoch)
