"""Schema versioning of the SQLite store."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest
from _store_helpers import make_run

from segue.errors import StoreError
from segue.store import SQLiteStore
from segue.store.migrations import LATEST, MIGRATIONS, Migration, migrate, schema_version


def _tables(db: Path) -> set[str]:
    with closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    return {r[0] for r in rows}


# Migrations are frozen text: the tables both backends create are written once
# (segue.store.tables) and must render exactly what each version shipped with.
SHIPPED = {
    "sqlite": ["6d897c7a2567c30d", "a6292300c0297418", "71cde2ad4e6d50fd", "7922dc2cc40032dc",
               "e382828448ee236d"],
    "postgres": ["f4420fa7bfcf0f96", "49010d0d042c5ee7", "f28b35d73dae48c1", "2eaee9061ab7ba18",
                 "4a8eb24767c11e4b", "d735b418f7726e3c"],
}


def test_shipped_migrations_keep_their_text() -> None:
    from segue.store import postgres_schema

    def digests(migrations: tuple[Migration, ...]) -> list[str]:
        return [hashlib.sha256("\n;\n".join(m.statements).encode()).hexdigest()[:16]
                for m in migrations]

    assert digests(MIGRATIONS)[: len(SHIPPED["sqlite"])] == SHIPPED["sqlite"]
    assert digests(postgres_schema.MIGRATIONS)[: len(SHIPPED["postgres"])] == SHIPPED["postgres"]


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    assert LATEST == len(MIGRATIONS)


def test_fresh_database_is_migrated_from_version_zero(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    sqlite3.connect(db).close()  # an empty file at user_version 0
    store = SQLiteStore(db)
    make_run(store)
    store.close()
    conn = sqlite3.connect(db)
    assert schema_version(conn) == LATEST
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    assert {"runs", "tasks", "checkpoints", "events"} <= _tables(db)


def test_reopening_keeps_data_and_version(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    SQLiteStore(db).close()
    store = SQLiteStore(db)
    make_run(store)
    store.close()
    assert [r.run_id for r in SQLiteStore(db).list_runs()] == ["r1"]


def test_database_from_a_newer_segue_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "segue.db"
    SQLiteStore(db).close()
    conn = sqlite3.connect(db)
    conn.execute(f"PRAGMA user_version = {LATEST + 1}")
    conn.close()
    with pytest.raises(
        StoreError,
        match=rf"^metadata store .*segue\.db has schema version {LATEST + 1}, newer than this "
        rf"segue supports \({LATEST}\); upgrade segue$",
    ):
        SQLiteStore(db)


def test_a_failing_migration_changes_nothing(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    broken = (
        *MIGRATIONS,
        Migration(LATEST + 1, "breaks halfway",
                  ("CREATE TABLE extra (x INTEGER)", "THIS IS NOT SQL")),
    )
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, "x.db", broken)
    assert schema_version(conn) == 0
    assert conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0
    assert migrate(conn, "x.db") == LATEST
    conn.close()


def test_unopenable_path_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"^cannot open metadata store .*missing"):
        SQLiteStore(tmp_path / "missing" / "segue.db")
