"""The PostgreSQL metadata schema, and the row-level SQL that runs on it.

The schema is an ordered list of migrations. The applied versions live in the
``segue_schema`` table (one row per migration); the database's version is the
largest. Migrations are frozen text, as for SQLite
(:mod:`segue.store.migrations`): never edit one that has shipped, append a new
one. Applying them is one transaction that first takes a transaction-scoped
advisory lock, so two processes that open a fresh database at once serialize
(PostgreSQL's DDL is transactional, but two concurrent ``CREATE TABLE IF NOT
EXISTS`` can still collide in the catalog); the second finds nothing to do.

Below the schema: :class:`Tx`, one transaction's view (queries, the
database's clock, the commit marker), and the row helpers that
:mod:`segue.store.postgres` builds its methods from. They run inside the
caller's transaction and never commit. This module never decides policy.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from .._canon import canonical_json
from .._faults import fault_point
from ..errors import StoreError, UnknownRunError
from .base import Event
from .migrations import Migration
from .sqlite_rows import _TASK_COLUMNS, _check_epoch

if TYPE_CHECKING:
    import psycopg

Row = dict[str, Any]

# pg_advisory_xact_lock key of "migrating the segue schema" (any fixed bigint:
# advisory locks are per database, and nothing else in segue takes this one).
MIGRATION_LOCK_KEY = 0x5E6E_0001
EVENTS_CHANNEL = "segue_events"  # NOTIFY'd with the run id by every event (see insert_event)

# Times are epoch seconds (double precision), as in the records; JSON columns
# are text holding canonical JSON, so fingerprints keep their exact bytes.
# State lists are spelled out, so a shipped schema never changes with the code.
_V1 = Migration(
    1,
    "runs, tasks, checkpoints, events, commit markers",
    (
        """
        CREATE TABLE runs (
            run_id text PRIMARY KEY,
            ord bigint GENERATED ALWAYS AS IDENTITY,
            flow_name text NOT NULL,
            flow_path text NOT NULL,
            params text NOT NULL,
            fingerprint text NOT NULL,
            options text NOT NULL,
            state text NOT NULL CHECK (state IN
                ('PENDING','RUNNING','PAUSING','PAUSED','SUCCEEDED','FAILED','CANCELLED')),
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            controller_epoch bigint NOT NULL DEFAULT 0,
            controller_pid integer,
            controller_host text,
            controller_lease_until double precision
        )
        """,
        "CREATE INDEX runs_by_created ON runs (created_at, ord)",
        "CREATE INDEX runs_by_flow ON runs (flow_name)",
        """
        CREATE TABLE tasks (
            run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step text NOT NULL,
            ord integer NOT NULL,
            state text NOT NULL CHECK (state IN
                ('PENDING','RUNNING','RETRYING','PARKED','SUCCEEDED','FAILED','CANCELLED')),
            epoch bigint NOT NULL DEFAULT 0,
            attempts integer NOT NULL DEFAULT 0,
            failures integer NOT NULL DEFAULT 0,
            pid integer,
            host text,
            lease_until double precision,
            progress_done double precision,
            progress_total double precision,
            output_ref text,
            error text,
            next_attempt_at double precision,
            started_at double precision,
            finished_at double precision,
            updated_at double precision NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """,
        """
        CREATE TABLE checkpoints (
            run_id text NOT NULL,
            step text NOT NULL,
            seq bigint NOT NULL,
            epoch bigint NOT NULL,
            path text NOT NULL,
            created_at double precision NOT NULL,
            position text NOT NULL,
            nbytes bigint NOT NULL,
            status text NOT NULL CHECK (status IN ('committed','quarantined','pruned')),
            PRIMARY KEY (run_id, step, seq),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """,
        "CREATE INDEX checkpoints_by_status ON checkpoints (status, run_id, step, seq)",
        # The id comes from one sequence (CACHE 1: nextval is monotone across
        # sessions) and is drawn while the writer holds its run's row lock, so
        # within a run ids rise in commit order (see postgres.py, "events").
        """
        CREATE TABLE events (
            id bigint GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY,
            run_id text NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step text,
            time double precision NOT NULL,
            actor text NOT NULL,
            kind text NOT NULL,
            from_state text,
            to_state text,
            reason text NOT NULL,
            data text NOT NULL
        )
        """,
        "CREATE INDEX events_by_run ON events (run_id, id)",
        # One row per committed write transaction, inserted inside it: after a
        # connection lost during COMMIT, the writer learns whether its
        # transaction committed by looking for its token (postgres.py, "retries").
        # Rows are purged after an hour.
        """
        CREATE TABLE commit_markers (
            token uuid PRIMARY KEY,
            at double precision NOT NULL
        )
        """,
        "CREATE INDEX commit_markers_by_age ON commit_markers (at)",
    ),
)

# The home's side of scheduling (postgres_extras.py, as sqlite_pool.py for SQLite):
# the local view of waiting requests, and run statistics.
_V2 = Migration(
    2,
    "waiting requests (local view), run statistics",
    (
        """
        CREATE TABLE requests (
            run_id text NOT NULL,
            step text NOT NULL,
            host text NOT NULL,
            priority integer NOT NULL,
            gpus integer NOT NULL,
            gpu_memory bigint,
            cpus double precision NOT NULL,
            memory bigint NOT NULL,
            submitted_at double precision NOT NULL,
            reason text NOT NULL,
            lease_until double precision NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """,
        """
        CREATE TABLE run_stats (
            run_id text NOT NULL,
            key text NOT NULL,
            value double precision NOT NULL,
            PRIMARY KEY (run_id, key)
        )
        """,
    ),
)

_V3 = Migration(
    3,
    "hosts: one row per host that runs a segue agent, with its lease and epoch",
    (
        """
        CREATE TABLE hosts (
            host text PRIMARY KEY,
            epoch bigint NOT NULL,
            pid bigint,
            info text NOT NULL,
            started_at double precision NOT NULL,
            seen_at double precision NOT NULL,
            lease_until double precision
        )
        """,
    ),
)

# The cluster-wide device pool (postgres_hostpool.py): the tables of the host pool file
# (hostpool.py, schema 5) with PostgreSQL's types, and the id by which every host
# names this database's runs in it (a URL differs from host to host).
_V4 = Migration(
    4,
    "the cluster-wide device pool, and the cluster's id",
    (
        "CREATE TABLE segue_cluster (id text PRIMARY KEY)",
        "INSERT INTO segue_cluster (id) VALUES (gen_random_uuid()::text)",
        """
        CREATE TABLE pool_hosts (
            host text PRIMARY KEY,
            cpus double precision NOT NULL,
            memory bigint NOT NULL,
            source text NOT NULL,
            updated_at double precision NOT NULL
        )
        """,
        """
        CREATE TABLE pool_devices (
            host text NOT NULL REFERENCES pool_hosts (host) ON DELETE CASCADE,
            device bigint NOT NULL,
            name text NOT NULL,
            memory bigint NOT NULL,
            virtual bigint NOT NULL,
            PRIMARY KEY (host, device)
        )
        """,
        """
        CREATE TABLE allocations (
            id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            host text NOT NULL,
            home text NOT NULL,
            run_id text NOT NULL,
            step text NOT NULL,
            epoch bigint,
            devices text NOT NULL,
            cpus double precision NOT NULL,
            memory bigint NOT NULL,
            priority bigint NOT NULL,
            preemptible bigint NOT NULL,
            since double precision NOT NULL,
            lease_until double precision NOT NULL,
            released_at double precision,
            ckpt_at double precision,
            preemptions bigint NOT NULL DEFAULT 0,
            gpu_memory bigint,
            per_worker bigint,
            min_gpus bigint,
            revoke text,
            parent bigint,
            accelerator text,
            UNIQUE (home, run_id, step, epoch)
        )
        """,
        "CREATE INDEX allocations_live ON allocations (host, released_at)",
        """
        CREATE TABLE pool_requests (
            home text NOT NULL,
            run_id text NOT NULL,
            step text NOT NULL,
            host text NOT NULL,
            priority bigint NOT NULL,
            gpus bigint NOT NULL,
            gpu_memory bigint,
            cpus double precision NOT NULL,
            memory bigint NOT NULL,
            submitted_at double precision NOT NULL,
            reason text NOT NULL,
            lease_until double precision NOT NULL,
            accelerator text,
            PRIMARY KEY (home, run_id, step)
        )
        """,
        """
        CREATE TABLE preemptions (
            id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            home text NOT NULL,
            run_id text NOT NULL,
            by_home text NOT NULL,
            by_run text NOT NULL,
            reason text NOT NULL,
            created_at double precision NOT NULL,
            lease_until double precision NOT NULL,
            outcome text,
            handled_at double precision,
            devices text
        )
        """,
        "CREATE INDEX preemptions_open ON preemptions (home, run_id, outcome)",
        """
        CREATE TABLE parked (
            home text NOT NULL,
            run_id text NOT NULL,
            since double precision NOT NULL,
            PRIMARY KEY (home, run_id)
        )
        """,
        """
        CREATE TABLE pool_changes (
            id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            time double precision NOT NULL,
            host text NOT NULL,
            actor text NOT NULL,
            "user" text NOT NULL,
            change text NOT NULL
        )
        """,
        "CREATE INDEX pool_changes_by_host ON pool_changes (host, id)",
    ),
)

# Readers of every run's events (the webhook outbox, /metrics) page by commit
# position: ids are drawn under each run's lock, so across runs a lower id can
# commit after a higher one. ``xid`` is the writing transaction's id; every
# transaction below ``pg_snapshot_xmin(pg_current_snapshot())`` has ended, so a
# reader that reads only below it, in (xid, id) order, and keeps the xid it
# consumed up to, never skips a late commit (postgres_outbox.py). Events written
# before this migration all get its own xid. The outbox tables mirror SQLite's
# (migrations.py, version 3); a cursor is that commit position, not an event id.
_V5 = Migration(
    5,
    "events' commit position (xid), the webhook outbox",
    (
        "ALTER TABLE events ADD COLUMN xid xid8 NOT NULL DEFAULT pg_current_xact_id()",
        "CREATE INDEX events_by_xid ON events (xid, id)",
        """
        CREATE TABLE notify_cursors (
            hook_id text PRIMARY KEY,
            after_xid bigint NOT NULL
        )
        """,
        """
        CREATE TABLE notify_outbox (
            event_id bigint NOT NULL,
            hook_id text NOT NULL,
            run_id text NOT NULL,
            event text NOT NULL,
            body text NOT NULL,
            status text NOT NULL CHECK (status IN ('pending','sending','delivered','failed')),
            attempts integer NOT NULL DEFAULT 0,
            next_at double precision NOT NULL,
            lease_until double precision,
            claim text,
            last_error text,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            PRIMARY KEY (event_id, hook_id)
        )
        """,
        "CREATE INDEX notify_outbox_due ON notify_outbox (status, next_at)",
    ),
)

# Step metrics, as in SQLite's version 5 (migrations.py): keyed by the step's own
# counter (an upsert), the latest point per (flow, step, name) kept apart for /metrics.
_V6 = Migration(
    6,
    "step metrics (ctx.log_metrics) and their latest value per flow",
    (
        """
        CREATE TABLE step_metrics (
            run_id text NOT NULL,
            step text NOT NULL,
            name text NOT NULL,
            idx bigint NOT NULL,
            value double precision,
            epoch bigint NOT NULL,
            time double precision NOT NULL,
            PRIMARY KEY (run_id, step, name, idx),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """,
        """
        CREATE TABLE step_metrics_latest (
            flow_name text NOT NULL,
            step text NOT NULL,
            name text NOT NULL,
            value double precision,
            time double precision NOT NULL,
            PRIMARY KEY (flow_name, step, name)
        )
        """,
    ),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)
LATEST = MIGRATIONS[-1].version

_VERSION_TABLE = """
CREATE TABLE IF NOT EXISTS segue_schema (
    version integer PRIMARY KEY,
    description text NOT NULL,
    applied_at double precision NOT NULL
)
"""


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The database's schema version: 0 for a database segue never opened."""
    row = conn.execute("SELECT to_regclass('segue_schema') IS NOT NULL").fetchone()
    if row is None or not _first(row):
        return 0
    row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM segue_schema").fetchone()
    return int(_first(row)) if row is not None else 0


def _first(row: Any) -> Any:
    return next(iter(row.values())) if isinstance(row, dict) else row[0]


def _too_new(label: str, found: int, known: int) -> StoreError:
    return StoreError(
        f"metadata store {label} has schema version {found}, newer than this segue "
        f"supports ({known}); upgrade segue"
    )


def migrate(
    conn: psycopg.Connection[Any], label: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> int:
    """Bring the database up to the newest version; return that version.

    ``conn`` must be in autocommit mode. Raises StoreError if the database is
    newer than ``migrations`` know. A failing migration rolls back every step
    of this call (DDL included), leaving the old version.
    """
    known = migrations[-1].version if migrations else 0
    found = schema_version(conn)
    if found == known:  # fast path: no lock for an up-to-date database
        return found
    if found > known:
        raise _too_new(label, found, known)
    conn.execute("BEGIN")
    try:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(_VERSION_TABLE)
        found = schema_version(conn)  # another process may have migrated meanwhile
        if found > known:
            raise _too_new(label, found, known)
        for m in migrations:
            if m.version <= found:
                continue
            for stmt in m.statements:
                conn.execute(stmt)  # type: ignore[call-overload]  # frozen DDL text of this module
            conn.execute(
                "INSERT INTO segue_schema (version, description, applied_at)"
                " VALUES (%s, %s, extract(epoch FROM clock_timestamp()))",
                (m.version, m.description),
            )
        conn.execute("COMMIT")
    except BaseException:
        if not conn.closed:
            conn.execute("ROLLBACK")
        raise
    return known


# -- one transaction ------------------------------------------------------------------------
class Tx:
    """One transaction of one method: its connection and its reading of the clock."""

    def __init__(self, conn: psycopg.Connection[Row], offset: float) -> None:
        self.conn = conn
        self.offset = offset
        self.token: uuid.UUID | None = None  # set once the commit marker is inserted
        self._t: float | None = None

    def one(self, sql: str, args: Sequence[Any] = ()) -> Row | None:
        return self.conn.execute(sql, args).fetchone()  # type: ignore[arg-type]

    def all(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return self.conn.execute(sql, args).fetchall()  # type: ignore[arg-type]

    def now(self) -> float:
        """The database's clock, read once per transaction, after the locks are held
        (a time read before waiting for a lock would judge a lease too early).
        The same statement inserts the transaction's commit marker."""
        if self._t is None:
            self.token = uuid.uuid4()
            row = self.one(
                "INSERT INTO commit_markers (token, at) VALUES (%s, extract(epoch FROM"
                " clock_timestamp())::float8) RETURNING at", (self.token,))
            self._t = float(cast(Row, row)["at"]) + self.offset
        return self._t

    def mark_if_written(self) -> None:
        """A write that changed rows without reading the clock still gets its marker."""
        if self.token is None and value(self.one("SELECT pg_current_xact_id_if_assigned()")):
            self.now()


def value(row: Row | None) -> Any:
    return None if row is None else next(iter(row.values()))


# -- rows, inside the caller's transaction -------------------------------------------------
def run_row(tx: Tx, run_id: str) -> Row:
    row = tx.one("SELECT * FROM runs WHERE run_id = %s", (run_id,))
    if row is None:
        raise UnknownRunError(run_id)
    return row


def lock_run(tx: Tx, run_id: str) -> Row:
    """The run's row, locked until the end of the transaction. Every writer of a
    run's events (and every judge of its controller lease) takes it first.
    NO KEY UPDATE: it still lets other transactions insert rows that refer to the run."""
    row = tx.one("SELECT * FROM runs WHERE run_id = %s FOR NO KEY UPDATE", (run_id,))
    if row is None:
        raise UnknownRunError(run_id)
    return row


def task_row(tx: Tx, run_id: str, step: str, *, lock: bool = False) -> Row:
    sql = "SELECT * FROM tasks WHERE run_id = %s AND step = %s"
    row = tx.one(sql + " FOR UPDATE" if lock else sql, (run_id, step))
    if row is None:
        run_row(tx, run_id)  # UnknownRunError if the run is the missing part
        raise StoreError(f"run {run_id!r} has no step {step!r}")
    return row


def fence(run_id: str, step: str, row: Row, epoch: int, *, need_running: bool = False) -> None:
    """FencedError unless ``epoch`` still holds the task; ``row`` must be locked."""
    _check_epoch(run_id, step, cast(Any, row), epoch, need_running=need_running)
    fault_point("store.fence_checked")  # tests stop a writer here, holding its locks


def update_task(tx: Tx, run_id: str, step: str, changes: dict[str, Any]) -> Row:
    bad = set(changes) - _TASK_COLUMNS
    if bad:
        raise ValueError(f"not task columns: {sorted(bad)}")
    cols = ", ".join(f"{c} = %s" for c in changes)  # names from the fixed set only
    row = tx.one(f"UPDATE tasks SET {cols} WHERE run_id = %s AND step = %s RETURNING *",
                 (*changes.values(), run_id, step))
    return cast(Row, row)


def insert_event(
    tx: Tx,
    run_id: str,
    kind: str,
    *,
    actor: str,
    reason: str,
    t: float,
    step: str | None = None,
    from_state: str | None = None,
    to_state: str | None = None,
    data: dict[str, Any] | None = None,
) -> Event:
    """Append an event. The caller holds the run's row lock (or created the run in
    this transaction): the id is drawn under it, so the run's ids follow commit order.
    The same statement notifies ``EVENTS_CHANNEL`` with the run id: listeners wake
    when the transaction commits (and never if it rolls back)."""
    text = canonical_json(dict(data or {}))
    frm = None if from_state is None else str(from_state)
    to = None if to_state is None else str(to_state)
    row = tx.one(
        "INSERT INTO events (run_id, step, time, actor, kind, from_state, to_state, reason, data)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING id, pg_notify(%s, run_id)",
        (run_id, step, t, str(actor), kind, frm, to, reason, text, EVENTS_CHANNEL))
    return Event(id=int(cast(Row, row)["id"]), run_id=run_id, step=step, time=t, actor=str(actor),
                 kind=kind, from_state=frm, to_state=to, reason=reason, data=json.loads(text))


def event_record(r: Row) -> Event:
    return Event(id=int(r["id"]), run_id=r["run_id"], step=r["step"], time=r["time"],
                 actor=r["actor"], kind=r["kind"], from_state=r["from_state"],
                 to_state=r["to_state"], reason=r["reason"], data=json.loads(r["data"]))
