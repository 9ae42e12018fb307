"""Fixtures of the store tests. Everything that knows about a particular backend
lives in the ``store`` fixture; the tests themselves only see the Store ABC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from segue.store import SQLiteStore, Store


@pytest.fixture
def store(request: pytest.FixtureRequest, tmp_path) -> Iterator[Store]:
    """A fresh, empty store of the backend named by the (indirect) parameter."""
    backend = getattr(request, "param", "sqlite")
    if backend == "sqlite":
        s: Store = SQLiteStore(tmp_path / "segue.db")
    else:
        # A "postgres" entry would build its store here, or skip saying which
        # server setting is missing; it must never pass silently.
        raise ValueError(f"unknown store backend {backend!r}")
    try:
        yield s
    finally:
        s.close()
