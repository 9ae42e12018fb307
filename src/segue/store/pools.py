"""``open_pool``: the host pool at a path or a PostgreSQL URL, either backend.

Apart from ``store.hostpool`` so the PostgreSQL pool (``store.postgres_hostpool``),
which builds on it, is imported only here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import StoreError
from .hostpool import POOL_ENV, SHARED_DIR, SqlHostPool, SQLiteHostPool, pool_path
from .postgres import is_postgres_url


def open_pool(path: str | Path | None = None, *, store: Any = None) -> SqlHostPool:
    """The pool at ``path`` (a file or a PostgreSQL URL; default :func:`pool_path`).
    ``store``: the caller's store; a pool in its database shares its connections."""
    where = path if path is not None else pool_path()
    if isinstance(where, str) and is_postgres_url(where):
        from .postgres_hostpool import PostgresHostPool

        return PostgresHostPool(store if getattr(store, "url", None) == where else where)
    p = Path(where)
    try:
        p.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if p.parent == SHARED_DIR else 0o700)
    except OSError as e:
        raise StoreError(f"cannot create the host pool directory {p.parent}: {e}; "
                         f"set {POOL_ENV} or --pool to a writable path") from e
    return SQLiteHostPool(p)
