"""Fixtures of the server tests: a home with tokens of every role, and the real app over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402
from segue_helpers import Segue  # noqa: E402

from segue.home import Home  # noqa: E402
from segue.server import create_app  # noqa: E402
from segue.server.auth import Role, TokenStore  # noqa: E402

BASE = "http://127.0.0.1:8765"  # the app's own origin in the TestClient's requests


@pytest.fixture
def home(segue: Segue) -> Home:
    """The home the `segue` fixture's CLI uses, created."""
    h = Home.resolve(segue.home)
    h.ensure()
    return h


@pytest.fixture
def tokens(home: Home) -> dict[str, str]:
    ts = TokenStore(home)
    return {
        "admin": ts.create("admin", Role.ADMIN),
        "viewer": ts.create("viewer", Role.VIEWER),
        "op": ts.create("op", Role.OPERATOR),
        "batchop": ts.create("batchop", Role.OPERATOR, may_pause=["batch"], may_resume=["batch"]),
    }


@pytest.fixture
def api(home: Home, _test_pool: Path) -> Iterator[TestClient]:
    with TestClient(create_app(home, pool=_test_pool), base_url=BASE) as c:
        yield c
