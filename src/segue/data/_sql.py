"""Connections from URLs, for the SQL source and sink: ``sqlite:///path`` or ``postgresql://...``.

A URL (not a live connection) is what sources and sinks keep, so they can be
rebuilt in another process and reconnect after a crash.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from ..errors import DataError

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def ident(name: str) -> str:
    """A table or column name, checked: names cannot be bound as parameters."""
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier (letters, digits, _; optional schema.)")
    return name


# The column type of a new table, from a value of the first batch, per dialect.
# PostgreSQL gets 64-bit integers and doubles (its INTEGER and REAL are 32-bit),
# and BOOLEAN: it refuses a boolean in an integer column.
_TYPES = {
    "sqlite": {bool: "INTEGER", int: "INTEGER", float: "REAL", str: "TEXT", bytes: "BLOB"},
    "postgres": {bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE PRECISION", str: "TEXT", bytes: "BYTEA"},
}
_NATIVE = (type(None), bool, int, float, str, bytes, bytearray, memoryview)


def column_type(values: Sequence[Any], dialect: str) -> str:
    """The type of a new column holding ``values`` (None ignored): ints and floats mixed
    are floats, anything else (dicts, lists, dates, mixed kinds) is TEXT holding JSON."""
    kinds = {bytes if isinstance(v, bytearray | memoryview) else type(v) for v in values if v is not None}
    if kinds == {int, float}:
        kinds = {float}
    only = kinds.pop() if len(kinds) == 1 else None
    return _TYPES[dialect].get(only, "TEXT") if only is not None else "TEXT"  # type: ignore[arg-type]


def is_text(declared: str) -> bool:
    """A text column, by SQLite's affinity rule (which fits PostgreSQL's type names too)."""
    t = declared.upper()
    return "CHAR" in t or "TEXT" in t or "CLOB" in t


def as_text(value: Any) -> Any:
    """A value for a text column: one the driver cannot bind as it is becomes JSON."""
    return value if isinstance(value, _NATIVE) else json.dumps(value, default=str)


def transient(exc: BaseException) -> bool:
    """Whether a database error may pass on a retry (busy, locked, I/O, a lost connection,
    a serialization failure), not one the same statement would hit again."""
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None:
            return isinstance(exc, sqlite3.OperationalError) and any(
                m in str(exc) for m in ("locked", "busy", "disk I/O", "unable to open"))
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR,
                               sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PROTOCOL)
    if type(exc).__module__.startswith("psycopg"):
        import psycopg

        # Class 08: connection; 40: rollback (serialization, deadlock); 53: resources;
        # 57P: the server is shutting down or starting; no SQLSTATE: the connection broke.
        state = getattr(exc, "sqlstate", None)
        if state is None:
            return isinstance(exc, psycopg.OperationalError)
        return state[:2] in ("08", "40", "53") or state[:3] == "57P"
    return True  # not a database error: the caller's usual retry rules apply


@contextmanager
def not_retried(where: str) -> Iterator[None]:
    """Re-raise a database error no retry can fix as a DataError (the step fails at once)."""
    try:
        yield
    except DataError:
        raise
    except Exception as exc:
        if transient(exc):
            raise
        detail = " ".join(str(exc).split())
        raise DataError(f"{where}: {type(exc).__name__}: {detail}; a retry would fail the same way: "
                        f"fix the table or the sink's settings, then `segue resume`") from exc


class Db:
    """One connection plus the dialect details the data sinks and sources need."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("sqlite:///"):
            self.dialect = "sqlite"
            self.conn: Any = sqlite3.connect(url[len("sqlite:///"):], timeout=30, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=FULL")
        elif url.startswith(("postgresql://", "postgres://")):
            try:
                import psycopg
            except ImportError as exc:  # pragma: no cover - environment
                raise ImportError("PostgreSQL needs psycopg 3; pip install 'segue[postgres]'") from exc
            self.dialect = "postgres"
            self.conn = psycopg.connect(url, autocommit=True)
        else:
            raise ValueError(f"unsupported database url {url!r}; use sqlite:///PATH or postgresql://...")

    def q(self, sql: str) -> str:
        """Queries are written with ``?``; psycopg wants ``%s``."""
        return sql.replace("?", "%s") if self.dialect == "postgres" else sql

    def execute(self, sql: str, args: tuple[Any, ...] | list[Any] = ()) -> Any:
        return self.conn.execute(self.q(sql), tuple(args))

    def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        if self.dialect == "postgres":
            with self.conn.cursor() as cur:
                cur.executemany(self.q(sql), rows)
        else:
            self.conn.executemany(sql, rows)

    def begin(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE" if self.dialect == "sqlite" else "BEGIN")

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - nothing to roll back
            pass

    def column_types(self, table: str) -> list[tuple[str, str]]:
        """(name, declared type) of each column of ``table`` in order; [] if there is no such table."""
        if self.dialect == "sqlite":
            schema, _, name = table.rpartition(".")
            rows = self.conn.execute(f"PRAGMA {schema + '.' if schema else ''}table_info({name})").fetchall()
            return [(r[1], r[2]) for r in rows]
        rows = self.execute("SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                            "WHERE a.attrelid = to_regclass(?) AND a.attnum > 0 AND NOT a.attisdropped "
                            "ORDER BY a.attnum", (table,)).fetchall()
        return [(r[0], r[1]) for r in rows]

    def table_exists(self, table: str) -> bool:
        return bool(self.column_types(table))

    def close(self) -> None:
        self.conn.close()
