"""Fixtures of the store tests. Everything that knows about a particular backend
lives here; the tests themselves only see the Store ABC (and, for the tests that
start other processes, a *target*: the SQLite file's path or the database URL).

PostgreSQL runs on a throwaway server (`pg_server`, in tests/conftest.py), one per pytest worker process, started
on first use; every test gets a fresh database. Without the server binaries or
psycopg, the postgres cases skip and say why; they never pass silently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pgserver
import pytest
from _store_helpers import open_target
from cluster_kit import QUICK, Cluster
from s3kit import s3_bucket

from segue.store import Store


@pytest.fixture
def new_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[str], str]]:
    """``new_target(backend)``: the target of a fresh, empty store of that backend.
    Databases made here are dropped after the test."""
    made: list[str] = []
    server: pgserver.PgServer | None = None

    def new(backend: str) -> str:
        nonlocal server
        if backend == "sqlite":
            path = tmp_path / f"db{len(made)}" / "segue.db"
            path.parent.mkdir()
            made.append(str(path))
            return str(path)
        if backend == "postgres":
            pg = request.getfixturevalue("pg_server")
            if isinstance(pg, str):
                pytest.skip(pg)
            server = pg
            made.append(pg.create_database())
            return made[-1]
        raise ValueError(f"unknown store backend {backend!r}")

    yield new
    if server is not None:
        for t in made:
            if t.startswith("postgresql://"):
                server.drop_database(t)


@pytest.fixture
def target(request: pytest.FixtureRequest, new_target: Callable[[str], str]) -> str:
    """The target of a fresh store of the backend named by the (indirect) parameter."""
    return new_target(getattr(request, "param", "sqlite"))


@pytest.fixture
def store(request: pytest.FixtureRequest, new_target: Callable[[str], str]) -> Iterator[Store]:
    """A fresh, empty store of the backend named by the (indirect) parameter."""
    s = open_target(new_target(getattr(request, "param", "sqlite")))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def cluster(new_target: Callable[[str], str], s3_endpoint: str, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    url = new_target("postgres")
    bucket, aws = s3_bucket(s3_endpoint)
    for k, v in aws.items():  # this process reads the outputs from the bucket too
        monkeypatch.setenv(k, v)
    from segue.store.postgres import PostgresStore

    store = PostgresStore(url)
    c = Cluster(tmp_path, {"SEGUE_STORE": url, **aws, **QUICK}, store)
    c.env["SEGUE_CHECKPOINTS"] = f"s3://{bucket}/runs"
    for host in "abc":
        (tmp_path / host).mkdir()
    try:
        yield c
    finally:
        c.stop()
        store.close()
