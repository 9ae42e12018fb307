"""Fixtures of the data tests; the doubles live in fakectx.py, the sink kit in sinkkit.py."""

from __future__ import annotations

from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow campaigns run only when asked: ``-m slow`` or SEGUE_RUN_SLOW=1."""
    import os

    if "slow" in (config.getoption("-m") or "") or os.environ.get("SEGUE_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow campaign; run with -m slow or SEGUE_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords and "/tests/data/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture()
def own_home(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """SEGUE_HOME in the test's own directory: a bare step context's dead letters land there."""
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="session")
def pg_url(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A throwaway PostgreSQL server for the session; skipped (with the install hint) if absent."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pgserver import PgServer, skip_reason

    why = skip_reason()
    if why:
        pytest.skip(why)
    server = PgServer.start()
    try:
        yield server.url
    finally:
        server.stop()
