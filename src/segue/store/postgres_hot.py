"""The hot writes of the PostgreSQL store, each one statement: one round trip.

A heartbeat, a controller's lease renewal and a run's transition happen many times a
second across a cluster. Written as a transaction of their own (BEGIN, lock, clock,
write, event, COMMIT), each costs six round trips; here each is one statement in
autocommit, so it is its own transaction. The statement does what the locked path
(:class:`~segue.store.postgres.PostgresStore`'s ``_write`` bodies) does when the write
is allowed, in the same order:

1. ``cur``: lock the row the write is judged by (``FOR UPDATE`` / ``FOR NO KEY UPDATE``);
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

from .postgres_schema import EVENTS_CHANNEL

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
