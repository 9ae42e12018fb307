"""SQLite version 6 rebuilds the tasks table (a CHECK gains SKIPPED): nothing is lost."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from segue.store.migrations import MIGRATIONS, migrate, schema_version
from segue.store.sqlite_rows import configure


def test_a_version_5_home_keeps_its_tasks_checkpoints_and_references(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    with closing(sqlite3.connect(db, isolation_level=None)) as conn:
        configure(conn)
        assert migrate(conn, "old", MIGRATIONS[:5]) == 5
        conn.execute("INSERT INTO runs (run_id, flow_name, flow_path, params, fingerprint, options, state,"
                     " created_at, updated_at) VALUES ('r', 'f', '/f.py', '{}', '{}', '{}', 'RUNNING', 1, 1)")
        for i, (step, state) in enumerate([("a", "SUCCEEDED"), ("b", "RUNNING"), ("c", "PENDING")]):
            conn.execute("INSERT INTO tasks (run_id, step, ord, state, epoch, output_ref, updated_at)"
                         " VALUES ('r', ?, ?, ?, ?, ?, 2)", (step, i, state, i + 1, f"out-{step}"))
        conn.execute("INSERT INTO checkpoints (run_id, step, seq, epoch, path, created_at, position, nbytes,"
                     " status) VALUES ('r', 'b', 1, 2, 'p', 3, '{}', 10, 'committed')")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE tasks SET state = 'SKIPPED' WHERE step = 'c'")
        before = conn.execute("SELECT * FROM tasks ORDER BY ord").fetchall()

        assert migrate(conn, "old") == schema_version(conn) == MIGRATIONS[-1].version
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1  # back on after the rebuild
        assert conn.execute("SELECT * FROM tasks ORDER BY ord").fetchall() == before
        assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 1
        conn.execute("UPDATE tasks SET state = 'SKIPPED' WHERE step = 'c'")
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE tasks SET state = 'BOGUS' WHERE step = 'c'")
        with pytest.raises(sqlite3.IntegrityError):  # the checkpoints still refer to their task
            conn.execute("INSERT INTO checkpoints (run_id, step, seq, epoch, path, created_at, position,"
                         " nbytes, status) VALUES ('r', 'nope', 1, 1, 'p', 3, '{}', 1, 'committed')")
        conn.execute("DELETE FROM runs WHERE run_id = 'r'")  # and go with them
        assert conn.execute("SELECT COUNT(*) FROM checkpoints").fetchone()[0] == 0
