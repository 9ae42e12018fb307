"""The text of the tables both metadata schemas create, written once.

SQLite's migrations (:mod:`segue.store.migrations`) and PostgreSQL's
(:mod:`segue.store.postgres_schema`) create these tables with the same columns;
only the type names differ, so each table is written here once with slots for
them ({T} text, {R} a float, {I} an integer, {B} a 64-bit integer, and the two
columns the backends declare differently) and rendered by :func:`sqlite` or
:func:`postgres`. Migrations are frozen text, and so is this: each template
renders exactly what its migrations shipped with (``tests/store/test_store_schema.py``
pins their digests); a changed table is a new migration, never an edit here.
"""

from __future__ import annotations

_SQLITE = {"T": "TEXT", "R": "REAL", "I": "INTEGER", "B": "INTEGER", "RUNS_ORD": "", "NAME": "tasks_v6",
           "EVENT_ID": "INTEGER PRIMARY KEY AUTOINCREMENT"}
_POSTGRES = {"T": "text", "R": "double precision", "I": "integer", "B": "bigint", "NAME": "tasks",
             # The creation order of runs, a tiebreak where created_at is equal (SQLite has rowid).
             "RUNS_ORD": "\n            ord bigint GENERATED ALWAYS AS IDENTITY,",
             # CACHE 1: nextval is monotone across sessions (see postgres.py, "events").
             "EVENT_ID": "bigint GENERATED ALWAYS AS IDENTITY (CACHE 1) PRIMARY KEY"}


def sqlite(table: str) -> str:
    """The CREATE TABLE of ``table`` as SQLite's migrations create it."""
    return TABLES[table].format(**_SQLITE)


def postgres(table: str) -> str:
    """The CREATE TABLE of ``table`` as PostgreSQL's migrations create it."""
    return TABLES[table].format(**_POSTGRES)


_RUNS = """
        CREATE TABLE runs (
            run_id {T} PRIMARY KEY,{RUNS_ORD}
            flow_name {T} NOT NULL,
            flow_path {T} NOT NULL,
            params {T} NOT NULL,
            fingerprint {T} NOT NULL,
            options {T} NOT NULL,
            state {T} NOT NULL CHECK (state IN
                ('PENDING','RUNNING','PAUSING','PAUSED','SUCCEEDED','FAILED','CANCELLED')),
            created_at {R} NOT NULL,
            updated_at {R} NOT NULL,
            controller_epoch {B} NOT NULL DEFAULT 0,
            controller_pid {I},
            controller_host {T},
            controller_lease_until {R}
        )
        """

_TASKS = """
        CREATE TABLE tasks (
            run_id {T} NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step {T} NOT NULL,
            ord {I} NOT NULL,
            state {T} NOT NULL CHECK (state IN
                ('PENDING','RUNNING','RETRYING','PARKED','SUCCEEDED','FAILED','CANCELLED')),
            epoch {B} NOT NULL DEFAULT 0,
            attempts {I} NOT NULL DEFAULT 0,
            failures {I} NOT NULL DEFAULT 0,
            pid {I},
            host {T},
            lease_until {R},
            progress_done {R},
            progress_total {R},
            output_ref {T},
            error {T},
            next_attempt_at {R},
            started_at {R},
            finished_at {R},
            updated_at {R} NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """

_CHECKPOINTS = """
        CREATE TABLE checkpoints (
            run_id {T} NOT NULL,
            step {T} NOT NULL,
            seq {B} NOT NULL,
            epoch {B} NOT NULL,
            path {T} NOT NULL,
            created_at {R} NOT NULL,
            position {T} NOT NULL,
            nbytes {B} NOT NULL,
            status {T} NOT NULL CHECK (status IN ('committed','quarantined','pruned')),
            PRIMARY KEY (run_id, step, seq),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """

_EVENTS = """
        CREATE TABLE events (
            id {EVENT_ID},
            run_id {T} NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
            step {T},
            time {R} NOT NULL,
            actor {T} NOT NULL,
            kind {T} NOT NULL,
            from_state {T},
            to_state {T},
            reason {T} NOT NULL,
            data {T} NOT NULL
        )
        """

_REQUESTS = """
        CREATE TABLE requests (
            run_id {T} NOT NULL,
            step {T} NOT NULL,
            host {T} NOT NULL,
            priority {I} NOT NULL,
            gpus {I} NOT NULL,
            gpu_memory {B},
            cpus {R} NOT NULL,
            memory {B} NOT NULL,
            submitted_at {R} NOT NULL,
            reason {T} NOT NULL,
            lease_until {R} NOT NULL,
            PRIMARY KEY (run_id, step)
        )
        """

_RUN_STATS = """
        CREATE TABLE run_stats (
            run_id {T} NOT NULL,
            key {T} NOT NULL,
            value {R} NOT NULL,
            PRIMARY KEY (run_id, key)
        )
        """

_HOSTS = """
        CREATE TABLE hosts (
            host {T} PRIMARY KEY,
            epoch {B} NOT NULL,
            pid {B},
            info {T} NOT NULL,
            started_at {R} NOT NULL,
            seen_at {R} NOT NULL,
            lease_until {R}
        )
        """

_POOL_HOSTS = """
        CREATE TABLE pool_hosts (
            host {T} PRIMARY KEY,
            cpus {R} NOT NULL,
            memory {B} NOT NULL,
            source {T} NOT NULL,
            updated_at {R} NOT NULL
        )
        """

_POOL_DEVICES = """
        CREATE TABLE pool_devices (
            host {T} NOT NULL REFERENCES pool_hosts (host) ON DELETE CASCADE,
            device {B} NOT NULL,
            name {T} NOT NULL,
            memory {B} NOT NULL,
            virtual {B} NOT NULL,
            PRIMARY KEY (host, device)
        )
        """

_NOTIFY_OUTBOX = """
        CREATE TABLE notify_outbox (
            event_id {B} NOT NULL,
            hook_id {T} NOT NULL,
            run_id {T} NOT NULL,
            event {T} NOT NULL,
            body {T} NOT NULL,
            status {T} NOT NULL CHECK (status IN ('pending','sending','delivered','failed')),
            attempts {I} NOT NULL DEFAULT 0,
            next_at {R} NOT NULL,
            lease_until {R},
            claim {T},
            last_error {T},
            created_at {R} NOT NULL,
            updated_at {R} NOT NULL,
            PRIMARY KEY (event_id, hook_id)
        )
        """

_STEP_METRICS = """
        CREATE TABLE step_metrics (
            run_id {T} NOT NULL,
            step {T} NOT NULL,
            name {T} NOT NULL,
            idx {B} NOT NULL,
            value {R},
            epoch {B} NOT NULL,
            time {R} NOT NULL,
            PRIMARY KEY (run_id, step, name, idx),
            FOREIGN KEY (run_id, step) REFERENCES tasks (run_id, step) ON DELETE CASCADE
        )
        """

_STEP_METRICS_LATEST = """
        CREATE TABLE step_metrics_latest (
            flow_name {T} NOT NULL,
            step {T} NOT NULL,
            name {T} NOT NULL,
            value {R},
            time {R} NOT NULL,
            PRIMARY KEY (flow_name, step, name)
        )
        """

# Version 6 (SQLite) / 7 (PostgreSQL): a task may be SKIPPED (a branch not taken, or
# a step whose every upstream was skipped). SQLite cannot alter a CHECK, so its
# migration rebuilds the table under this name and renames it (migrations.py).
_TASKS_SKIPPED = _TASKS.replace("CREATE TABLE tasks (", "CREATE TABLE {NAME} (").replace(
    "'FAILED','CANCELLED'))", "'FAILED','CANCELLED','SKIPPED'))")

# Version 7 (SQLite) / 8 (PostgreSQL): schedules (`segue schedule`, docs/schedules.md).
# last_slot is the newest slot fired or skipped (the fence of Store.fire_slot),
# last_run the run of the newest slot fired.
_SCHEDULES = """
        CREATE TABLE schedules (
            name {T} PRIMARY KEY,
            flow_path {T} NOT NULL,
            params {T} NOT NULL,
            options {T} NOT NULL,
            cron {T} NOT NULL,
            tz {T} NOT NULL,
            catch_up {T} NOT NULL CHECK (catch_up IN ('none','latest','all')),
            overlap {T} NOT NULL CHECK (overlap IN ('skip','queue','cancel')),
            paused {I} NOT NULL DEFAULT 0,
            created_at {R} NOT NULL,
            created_by {T} NOT NULL,
            updated_at {R} NOT NULL,
            last_slot {R},
            last_run {T},
            last_error {T}
        )
        """

TABLES = {
    "runs": _RUNS,
    "tasks": _TASKS,
    "checkpoints": _CHECKPOINTS,
    "events": _EVENTS,
    "requests": _REQUESTS,
    "run_stats": _RUN_STATS,
    "hosts": _HOSTS,
    "pool_hosts": _POOL_HOSTS,
    "pool_devices": _POOL_DEVICES,
    "notify_outbox": _NOTIFY_OUTBOX,
    "step_metrics": _STEP_METRICS,
    "step_metrics_latest": _STEP_METRICS_LATEST,
    "tasks_skipped": _TASKS_SKIPPED,
    "schedules": _SCHEDULES,
}
