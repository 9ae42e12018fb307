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


@dataclass(frozen=True)
class Migration:
    version: int  # the user_version the database has once this step is applied
    description: str
    statements: tuple[str, ...]  # run one by one: executescript() would COMMIT


# State lists are spelled out (not generated from the enums) so that the
# schema of a shipped version never changes when the code does.
_V1 = Migration(
    1,
    "runs, tasks, checkpoints and events",
    (
        """
        CREATE TABLE runs (
            run_id TEXT PRIMARY KEY,
            flow_name TEXT NOT NULL,
            flow_path TEXT NOT NULL,
            params TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            options TEXT NOT NULL,
            state TEXT NOT NULL CHECK (state IN
                ('PENDING','RUNNING','PAUSING','PAUSED','SUCCEEDED','FAILED','CANCELLED')),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            controller_epoch INTEGER NOT NULL DEFAULT 0,
            controller_pid INTEGER,
            controller_host TEXT,
            controller_lease_until REAL
        )
        """,
        "CREATE INDEX runs_by_created ON runs (created_at)",
        """
        CREATE TABLE tasks (
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step TEXT NOT NULL,
            ord INTEGER NOT NULL,
            state TEXT NOT NULL CHECK (state IN
                ('PENDING','RUNNING','RETRYING','PARKED','SUCCEEDED','FAILED','CANCELLED')),
            epoch INTEGER NOT NULL DEFAULT 0,
            attempts INTEGER NOT NULL DEFAULT 0,
            failures INTEGER NOT NULL DEFAULT 0,
            pid INTEGER,
            host TEXT,
            lease_until REAL,
            progress_done REAL,
            progress_total REAL,
            output_ref TEXT,
            error TEXT,
            next_attempt_at REAL,
            started_at REAL,
            finished_at REAL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """,
        """
        CREATE TABLE checkpoints (
            run_id TEXT NOT NULL,
            step TEXT NOT NULL,
            seq INTEGER NOT NULL,
            epoch INTEGER NOT NULL,
            path TEXT NOT NULL,
            created_at REAL NOT NULL,
            position TEXT NOT NULL,
            nbytes INTEGER NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('committed','quarantined','pruned')),
            PRIMARY KEY (run_id, step, seq),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """,
        """
        CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step TEXT,
            time REAL NOT NULL,
            actor TEXT NOT NULL,
            kind TEXT NOT NULL,
            from_state TEXT,
            to_state TEXT,
            reason TEXT NOT NULL,
            data TEXT NOT NULL
        )
        """,
        "CREATE INDEX events_by_run ON events (run_id, id)",
    ),
)

_V2 = Migration(
    2,
    "resource pool: hosts, devices, allocations, waiting requests, run statistics",
    (
        """
        CREATE TABLE pool_hosts (
            host TEXT PRIMARY KEY,
            cpus REAL NOT NULL,
            memory INTEGER NOT NULL,
            source TEXT NOT NULL,
            updated_at REAL NOT NULL
        )
        """,
        """
        CREATE TABLE pool_devices (
            host TEXT NOT NULL REFERENCES pool_hosts (host) ON DELETE CASCADE,
            device INTEGER NOT NULL,
            name TEXT NOT NULL,
            memory INTEGER NOT NULL,
            virtual INTEGER NOT NULL,
            PRIMARY KEY (host, device)
        )
        """,
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
        """
        CREATE TABLE requests (
            run_id TEXT NOT NULL,
            step TEXT NOT NULL,
            host TEXT NOT NULL,
            priority INTEGER NOT NULL,
            gpus INTEGER NOT NULL,
            gpu_memory INTEGER,
            cpus REAL NOT NULL,
            memory INTEGER NOT NULL,
            submitted_at REAL NOT NULL,
            reason TEXT NOT NULL,
            lease_until REAL NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """,
        """
        CREATE TABLE run_stats (
            run_id TEXT NOT NULL,
            key TEXT NOT NULL,
            value REAL NOT NULL,
            PRIMARY KEY (run_id, key)
        )
        """,
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
        """
        CREATE TABLE notify_outbox (
            event_id INTEGER NOT NULL,
            hook_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            event TEXT NOT NULL,
            body TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('pending','sending','delivered','failed')),
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at REAL NOT NULL,
            lease_until REAL,
            claim TEXT,
            last_error TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            PRIMARY KEY (event_id, hook_id)
        )
        """,
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
        """
        CREATE TABLE hosts (
            host TEXT PRIMARY KEY,
            epoch INTEGER NOT NULL,
            pid INTEGER,
            info TEXT NOT NULL,
            started_at REAL NOT NULL,
            seen_at REAL NOT NULL,
            lease_until REAL
        )
        """,
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
        """
        CREATE TABLE step_metrics (
            run_id TEXT NOT NULL,
            step TEXT NOT NULL,
            name TEXT NOT NULL,
            idx INTEGER NOT NULL,
            value REAL,
            epoch INTEGER NOT NULL,
            time REAL NOT NULL,
            PRIMARY KEY (run_id, step, name, idx),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """,
        """
        CREATE TABLE step_metrics_latest (
            flow_name TEXT NOT NULL,
            step TEXT NOT NULL,
            name TEXT NOT NULL,
            value REAL,
            time REAL NOT NULL,
            PRIMARY KEY (flow_name, step, name)
        )
        """,
    ),
)

MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5)
LATEST = MIGRATIONS[-1].version


def schema_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _too_new(label: str, found: int, known: int) -> StoreError:
    return StoreError(
        f"metadata store {label} has schema version {found}, newer than this segue "
        f"supports ({known}); upgrade segue"
    )


def migrate(
    conn: sqlite3.Connection, label: str, migrations: tuple[Migration, ...] = MIGRATIONS
) -> int:
    """Bring the database up to the newest version; return that version.

    ``conn`` must be in autocommit mode (``isolation_level=None``). Raises
    StoreError if the database is newer than ``migrations`` know. A failing
    migration rolls back every step of this call, leaving the old version.
    """
    known = migrations[-1].version if migrations else 0
    found = schema_version(conn)
    if found == known:  # fast path: no write lock for an up-to-date database
        return found
    if found > known:
        raise _too_new(label, found, known)
    # IMMEDIATE takes the write lock before reading the version, so a second
    # process racing to migrate waits here and then sees the new version.
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = schema_version(conn)
        if found > known:
            raise _too_new(label, found, known)
        for m in migrations:
            if m.version <= found:
                continue
            for stmt in m.statements:
                conn.execute(stmt)
            # PRAGMA takes no bound parameters; m.version is an int from this module.
            conn.execute(f"PRAGMA user_version = {int(m.version)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return known


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
