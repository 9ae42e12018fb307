"""The metadata store: the interface, its records, and the backends.

``open_store(home)`` is how the rest of segue gets a store; backends are
chosen here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from .base import (
    CheckpointRecord,
    Event,
    Heartbeat,
    NewRun,
    RunRecord,
    Store,
    TaskRecord,
)
from .sqlite import SQLiteStore

__all__ = [
    "CheckpointRecord",
    "Event",
    "Heartbeat",
    "NewRun",
    "RunRecord",
    "SQLiteStore",
    "Store",
    "TaskRecord",
    "open_store",
]

DB_NAME = "segue.db"


def open_store(home: Path) -> Store:
    """Open (creating if needed) the metadata store of a segue home directory."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    return SQLiteStore(home / DB_NAME)
