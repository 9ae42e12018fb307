"""The ``client`` fixture: the same contract tests against a home and against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serverkit import ServerProcess

from segue.client.base import BaseClient


@pytest.fixture
def server(tmp_path: Path, _test_pool: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "home", _test_pool, tmp_path) as srv:
        yield srv


@pytest.fixture(params=["local", "http"])
def client(request: pytest.FixtureRequest, tmp_path: Path, _test_pool: Path) -> Iterator[BaseClient]:
    from segue import Client

    if request.param == "local":
        yield Client(tmp_path / "home", pool=_test_pool)
        return
    with ServerProcess(tmp_path / "home", _test_pool, tmp_path) as srv, \
            Client(srv.url, token=srv.token) as c:
        yield c
