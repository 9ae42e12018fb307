"""Connections from URLs, for the SQL source and sink: ``sqlite:///path`` or ``postgresql://...``.

A URL (not a live connection) is what sources and sinks keep, so they can be
rebuilt in another process and reconnect after a crash.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def ident(name: str) -> str:
    """A table or column name, checked: names cannot be bound as parameters."""
    if not _IDENT.match(name):
        raise ValueError(f"{name!r} is not a plain SQL identifier (letters, digits, _; optional schema.)")
    return name


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

    def close(self) -> None:
        self.conn.close()
