"""The cluster-wide device pool: the host pool's tables in a PostgreSQL store's database.

With a PostgreSQL store every host shares one pool, so an urgent run submitted
on one host can preempt a batch run on another, and a device is never held
twice across hosts. The SQL is the pool file's (:class:`~segue.store.hostpool.
SqlHostPool`); this module only runs it on PostgreSQL:

* every write takes one transaction-level advisory lock first, so writes to the
  pool are serialised exactly as SQLite's ``BEGIN IMMEDIATE`` serialises them:
  the read of the free capacity and the insert after it judge the same pool;
* reads are one ``REPEATABLE READ READ ONLY`` snapshot;
* times are the database's clock (``Tx.now()``), never a host's, so a host whose
  clock is off can neither keep a lapsed allocation nor expire a live one;
* a lost connection is retried by the store's rules (a COMMIT whose answer was
  lost is settled by its commit marker, so nothing is allocated twice).

Runs are named in the pool by the cluster's id (``PostgresStore.cluster_key``),
not by a home's path: the same run's controller may live on any host.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from .hostpool import SqlHostPool
from .hostpool_rows import Db
from .postgres import PostgresStore
from .postgres_schema import Tx

T = TypeVar("T")

POOL_LOCK_KEY = 0x5E6E_0002  # MIGRATION_LOCK_KEY + 1: one lock for every write to the pool
_SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


@functools.lru_cache(maxsize=256)
def _pg(sql: str) -> str:
    return sql.replace("?", "%s")  # the pool's SQL has no other ? and no %


class _PgDb:
    """One PostgreSQL transaction as the pool's SQL sees it."""

    def __init__(self, tx: Tx, *, write: bool) -> None:
        self.tx, self.write = tx, write
        self._t: float | None = None

    def execute(self, sql: str, args: Sequence[Any] = ()) -> Any:
        return self.tx.conn.execute(_pg(sql), args)  # type: ignore[call-overload]

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self.tx.conn.cursor() as cur:
            cur.executemany(_pg(sql), rows)  # type: ignore[call-overload]

    def now(self) -> float:
        if self.write:
            return self.tx.now()  # read after the lock; inserts the commit marker too
        if self._t is None:  # a read-only snapshot cannot insert the marker
            row = self.tx.one("SELECT extract(epoch FROM clock_timestamp())::float8 AS t")
            self._t = float(cast(Any, row)["t"]) + self.tx.offset
        return self._t


class PostgresHostPool(SqlHostPool):
    """The pool of every host that shares a PostgreSQL store. Picklable: it travels as its URL."""

    cluster = True

    def __init__(self, store: PostgresStore | str) -> None:
        self._owns = not isinstance(store, PostgresStore)
        self.store = store if isinstance(store, PostgresStore) else PostgresStore(store)
        self.path = self.store.url  # a worker opens the same pool from it

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.store.url,))

    def __repr__(self) -> str:
        return f"PostgresHostPool({self.store!r})"

    def close(self) -> None:
        """Close the connections, unless they are a store's that lent them (open_pool)."""
        if self._owns:
            self.store.close()

    def _write(self, body: Callable[[Db], T]) -> T:
        def locked(tx: Tx) -> T:
            tx.one("SELECT pg_advisory_xact_lock(%s)", (POOL_LOCK_KEY,))
            return body(_PgDb(tx, write=True))

        return self.store._write(locked)

    def _read(self, body: Callable[[Db], T]) -> T:
        return self.store._run(lambda tx: body(_PgDb(tx, write=False)), _SNAPSHOT, "COMMIT")
