"""The metadata store: the interface, its records, and the backends.

``open_store(home)`` is how the rest of segue gets a store; backends are
chosen here and nowhere else (:func:`store_url`): ``$SEGUE_STORE`` (the CLI's
``--store URL`` exports it), else the ``store`` key of ``HOME/config.json``,
else SQLite in ``HOME/segue.db``. A URL must be ``postgresql://`` (or
``postgres://``); anything else is a UsageError. The readers of every run's
events (the webhook outbox, the /metrics reader) are chosen the same way
(:func:`open_outbox`, :func:`open_metrics_reader`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StoreError, UsageError
from .base import (
    CheckpointRecord,
    Event,
    Heartbeat,
    HostRecord,
    NewRun,
    RunRecord,
    Store,
    TaskRecord,
)
from .sqlite import SQLiteStore

if TYPE_CHECKING:
    from .base import Clock
    from .metrics_rows import MetricsReader
    from .outbox import SQLiteOutbox
    from .postgres_metrics import PostgresMetricsReader
    from .postgres_outbox import PostgresOutbox

__all__ = [
    "CheckpointRecord",
    "Event",
    "Heartbeat",
    "HostRecord",
    "NewRun",
    "RunRecord",
    "SQLiteStore",
    "Store",
    "TaskRecord",
    "STORE_ENV",
    "check_store_url",
    "open_metrics_reader",
    "open_outbox",
    "open_store",
    "sqlite_only",
    "store_url",
]

DB_NAME = "segue.db"
STORE_ENV = "SEGUE_STORE"
CONFIG_NAME = "config.json"
ACCEPTED = "postgresql://USER@HOST[:PORT]/DB (or postgres://...)"


def check_store_url(url: str, where: str) -> str:
    """``url`` if it names a store segue can open; else a one-line UsageError
    (the URL's password is never echoed)."""
    from .postgres import _label, is_postgres_url

    if not is_postgres_url(url):
        shown = _label(url) if "://" in url else url
        raise UsageError(f"{where}: unsupported metadata store {shown!r}; use {ACCEPTED}, "
                         f"or leave it unset for SQLite in HOME/{DB_NAME}")
    return url


def store_url(home: Path, url: str | None = None) -> str | None:
    """The PostgreSQL URL a home's metadata lives at, or None for its SQLite file.

    ``url``: the store given explicitly (``segue --store``, ``Client(store=)``, the
    record a controller hands its workers); it wins over ``$SEGUE_STORE`` and the
    home's config."""
    if url:
        return check_store_url(url, "store")
    env = os.environ.get(STORE_ENV, "")
    if env:
        return check_store_url(env, f"${STORE_ENV}")
    cfg = Path(home) / CONFIG_NAME
    try:
        text = cfg.read_text()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"cannot read {cfg} ({e.strerror})") from None
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise UsageError(f"{cfg} is not valid JSON ({e})") from None
    url = doc.get("store") if isinstance(doc, dict) else None
    if url in (None, ""):
        return None
    if not isinstance(url, str):
        raise UsageError(f"{cfg}: \"store\" must be a string; use {ACCEPTED}")
    return check_store_url(url, str(cfg))


def open_store(home_or_url: str | os.PathLike[str], url: str | None = None, *,
               create: bool = True) -> Store:
    """The metadata store of a segue home directory (``url``: an explicit store, see
    :func:`store_url`), or of a PostgreSQL URL given in its place.

    With ``create`` (the default) a home and its SQLite file are created if missing;
    without it, a home that has no store is a StoreError and nothing is written (the
    scheduler opening another user's home must not create one there)."""
    if isinstance(home_or_url, str) and "://" in home_or_url:  # a URL, not a home
        from .postgres import PostgresStore

        return PostgresStore(check_store_url(home_or_url, "store"))
    home = Path(home_or_url)
    if create:
        home.mkdir(parents=True, exist_ok=True)
    url = store_url(home, url)
    if url is not None:
        from .postgres import PostgresStore

        return PostgresStore(url, home=str(home))
    if not create and not (home / DB_NAME).is_file():
        raise StoreError(f"{home} has no metadata store ({DB_NAME})")
    return SQLiteStore(home / DB_NAME)


def open_outbox(home: Path, *, clock: Clock | None = None,
                url: str | None = None) -> SQLiteOutbox | PostgresOutbox:
    """The webhook outbox of a home's store (its own connections; close() it).
    ``clock`` times deliveries; default: SQLite's :func:`~segue.store.base.now`,
    PostgreSQL's database clock. ``url``: an explicit store, see :func:`store_url`."""
    url = store_url(Path(home), url)
    if url is not None:
        from .postgres import PostgresStore
        from .postgres_outbox import PostgresOutbox

        return PostgresOutbox(PostgresStore(url, home=str(home)), clock=clock, owns_store=True)
    from .base import now
    from .outbox import SQLiteOutbox

    return SQLiteOutbox(Path(home) / DB_NAME, clock=clock or now)


def open_metrics_reader(home: Path, url: str | None = None) -> MetricsReader | PostgresMetricsReader:
    """The /metrics reader of a home's store (its own connections; close() it);
    ``url``: an explicit store, see :func:`store_url`."""
    url = store_url(Path(home), url)
    if url is not None:
        from .postgres import PostgresStore
        from .postgres_metrics import PostgresMetricsReader

        return PostgresMetricsReader(PostgresStore(url, home=str(home)), owns_store=True)
    from .metrics_rows import MetricsReader

    return MetricsReader(Path(home) / DB_NAME)


def sqlite_only(home: Path, what: str) -> None:
    """StoreError unless the home's metadata is in SQLite: ``what`` is not ported yet."""
    url = store_url(home)
    if url is not None:
        from .postgres import _label

        raise StoreError(f"{what} needs the SQLite metadata store; this home uses "
                         f"{_label(url)}, where it is not supported yet")
