"""The SQLite metadata schema, as an ordered list of migrations.

The schema version lives in ``PRAGMA user_version``: version N means the first
N migrations have been applied. Migrations are frozen text: never edit one that
has shipped; append a new one instead. Applying them is one ``BEGIN IMMEDIATE``
transaction, so two processes that open a fresh database at once serialize and
the second finds nothing left to do.

This module owns the schema only; it must never read or write run data.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass

from ..errors import StoreError
from .tables import sqlite


@dataclass(frozen=True)
class Migration:
    version: int  # the user_version the database has once this step is applied
    description: str
    statements: tuple[str, ...]  # run one by one: executescript() would COMMIT
    # A table rebuild (SQLite's way to change a CHECK): foreign keys are off while it
    # runs, or dropping the old table would cascade into the rows that refer to it.
    rebuilds: bool = False


# State lists are spelled out (not generated from the enums) so that the
# schema of a shipped version never changes when the code does.
_V1 = Migration(
    1,
    "runs, tasks, checkpoints and events",
    (
        sqlite("runs"),
        "CREATE INDEX runs_by_created ON runs (created_at)",
        sqlite("tasks"),
        sqlite("checkpoints"),
        sqlite("events"),
        "CREATE INDEX events_by_run ON events (run_id, id)",
    ),
)

_V2 = Migration(
    2,
    "resource pool: hosts, devices, allocations, waiting requests, run statistics",
    (
        sqlite("pool_hosts"),
        sqlite("pool_devices"),
        """
        CREATE TABLE allocations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            host TEXT NOT NULL,
            run_id TEXT NOT NULL,
            step TEXT NOT NULL,
            epoch INTEGER NOT NULL,
            devices TEXT NOT NULL,
            cpus REAL NOT NULL,
            memory INTEGER NOT NULL,
            priority INTEGER NOT NULL,
            preemptible INTEGER NOT NULL,
            since REAL NOT NULL,
            lease_until REAL NOT NULL,
            released_at REAL,
            UNIQUE (run_id, step, epoch)
        )
        """,
        "CREATE INDEX allocations_live ON allocations (host, released_at)",
        sqlite("requests"),
        sqlite("run_stats"),
    ),
)

_V3 = Migration(
    3,
    "webhook outbox (per-hook event cursors, deliveries); checkpoints indexed by status",
    (
        # How far each webhook has read the event log: events after it are
        # matched against the hook and queued; nothing before it is ever sent.
        """
        CREATE TABLE notify_cursors (
            hook_id TEXT PRIMARY KEY,
            after_event INTEGER NOT NULL
        )
        """,
        # One row per (event, hook): the delivery id is the event id. A pump
        # claims a row (status sending, with a lease) before it sends, so two
        # pumps never send the same delivery at once.
        sqlite("notify_outbox"),
        "CREATE INDEX notify_outbox_due ON notify_outbox (status, next_at)",
        # /metrics reads the live (not pruned) checkpoints, and the newest committed
        # one of each step, at every scrape: a few rows per step, not its history.
        "CREATE INDEX checkpoints_by_status ON checkpoints (status, run_id, step, seq)",
    ),
)

_V4 = Migration(
    4,
    "hosts: one row per host that runs a segue agent, with its lease and epoch",
    (
        sqlite("hosts"),
    ),
)

# What steps log with ctx.log_metrics. A point is keyed by the step's own counter
# (idx), so an attempt that redoes steps after a resume replaces them (an upsert);
# value NULL: the step logged NaN or an infinity. The latest point per (flow, step,
# name) is kept apart, so a /metrics scrape reads a few rows, not every run's history.
_V5 = Migration(
    5,
    "step metrics (ctx.log_metrics) and their latest value per flow",
    (
        sqlite("step_metrics"),
        sqlite("step_metrics_latest"),
    ),
)

# The task state SKIPPED (flows that branch, docs/flows.md). SQLite's documented way
# to change a CHECK: build the new table, copy, drop the old one, rename.
_V6 = Migration(
    6,
    "tasks may be SKIPPED (a branch not taken)",
    (
        sqlite("tasks_skipped"),
        "INSERT INTO tasks_v6 SELECT * FROM tasks",
        "DROP TABLE tasks",
        "ALTER TABLE tasks_v6 RENAME TO tasks",
    ),
    rebuilds=True,
)

# Schedules (`segue schedule`, docs/schedules.md): one row per schedule, fenced by its
# last slot (Store.fire_slot).
_V7 = Migration(
    7,
    "schedules",
    (sqlite("schedules"),),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7)
LATEST = MIGRATIONS[-1].version


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def pending(migrations: tuple[Migration, ...], found: int, label: str) -> list[Migration]:
    """The migrations a database at version ``found`` still needs, oldest first (both
    backends); a StoreError if it is newer than every one of them."""
    known = migrations[-1].version if migrations else 0
    if found > known:
        raise StoreError(
            f"metadata store {label} has schema version {found}, newer than this segue "
            f"supports ({known}); upgrade segue"
        )
    return [m for m in migrations if m.version > found]


def migrate(
    conn: sqlite3.Connection, label: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> int:
    """Bring the database up to the newest version; return that version.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Raises
    StoreError if the database is newer than ``migrations`` know. A failing
    migration rolls back every step of this call, leaving the old version.
    """
    found = schema_version(conn)
    todo = pending(migrations, found, label)
    if not todo:
        return found  # fast path: no write lock for an up-to-date database
    # The pragma is a no-op inside a transaction, so it is set (and restored) around it.
    keys_on = bool(conn.execute("PRAGMA foreign_keys").fetchone()[0])
    rebuild = keys_on and any(m.rebuilds for m in todo)
    if rebuild:
        conn.execute("PRAGMA foreign_keys = OFF")
    # IMMEDIATE takes the write lock before reading the version, so a second
    # process racing to migrate waits here and then sees the new version.
    conn.execute("BEGIN IMMEDIATE")
    try:
        for m in pending(migrations, schema_version(conn), label):
            for stmt in m.statements:
                conn.execute(stmt)
            # PRAGMA takes no bound parameters; m.version is an int from this module.
            conn.execute(f"PRAGMA user_version = {int(m.version)}")
        if rebuild and conn.execute("PRAGMA foreign_key_check").fetchone() is not None:
            raise StoreError(f"metadata store {label}: a migration left rows whose references "
                             "dangle; nothing was changed (report this as a bug)")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        if rebuild:
            conn.execute("PRAGMA foreign_keys = ON")
    return schema_version(conn)


def connect(path: str | os.PathLike[str]) -> sqlite3.Connection:
    """A connection to a home's database, configured and migrated to this version: how
    the store, the metrics reader and the webhook outbox each open theirs."""
    from .sqlite_rows import BUSY_TIMEOUT_S, configure

    try:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=True)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open metadata store {path}: {e}") from e
    try:
        configure(conn)
        migrate(conn, str(path))
    except BaseException:
        conn.close()
        raise
    return conn
