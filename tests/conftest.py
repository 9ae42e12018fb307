"""Fixtures shared by the whole suite."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pgserver
import pytest
from segue_helpers import FLOWS, Segue

# The device pool is host-wide (SEGUE_POOL, else /var/lib/segue or ~/.local/state):
# no test may touch the real one. Session fixtures get a session pool; each
# test its own, so leftovers of one test never hold another's devices.
_SESSION_POOL = tempfile.mkdtemp(prefix="segue-test-pool-")
atexit.register(shutil.rmtree, _SESSION_POOL, True)
os.environ["SEGUE_POOL"] = str(Path(_SESSION_POOL) / "pool.db")
# Likewise a metadata store named in the shell: tests' homes use SQLite unless a
# test gives them a throwaway database (tests/store/test_postgres_home.py).
os.environ.pop("SEGUE_STORE", None)


# The longest modules start first: with two xdist workers, a long test that
# starts last decides when the suite ends (see `make test`, --dist worksteal).
LONG_FIRST = ("test_agent_failover.py", "test_cluster_pool.py", "test_kill_campaign.py", "test_disk_full.py", "test_map_steps.py",
              "test_verify.py", "test_preemption.py", "test_server_fuzz.py", "test_server_load.py", "test_enospc_stress.py",
              "test_accounting.py", "test_faults.py", "test_ui_browser.py")


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile segue once, before any test starts a process (only in xdist's
    controller, or a run without it). An editable install has no bytecode, and where
    $PYTHONDONTWRITEBYTECODE is set (CI, this project's machines) none is ever written:
    each of the suite's thousands of segue processes compiled its imports again."""
    if not hasattr(config, "workerinput"):
        import compileall

        import segue

        root = Path(segue.__file__).parent
        if os.access(root, os.W_OK):
            compileall.compile_dir(str(root), quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda it: rank.get(it.path.name, len(LONG_FIRST)))  # stable: the rest keep their order


def _processes_under(root: str) -> list[int]:
    """Pids of this user's processes whose command line names a path under ``root``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if any(a == root or a.startswith(root + "/") for a in argv):
            pids.append(int(entry))
    return pids


@pytest.fixture(autouse=True)
def _test_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "pool.db"
    monkeypatch.setenv("SEGUE_POOL", str(path))
    yield path
    # A test that failed or timed out can leave a controller and its workers behind;
    # they would spin for ever once pytest removes the directory, and load the next
    # tests. Whatever still runs against this test's directory dies with the test.
    for pid in _processes_under(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def segue(tmp_path: Path, _test_pool: Path) -> Segue:
    return Segue(tmp_path / "home")


S3_MISSING = "S3 tests need moto's server and s3fs: pip install 'moto[server]' s3fs"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API server (moto's) on loopback for this session: its URL."""
    import socket

    try:
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError:
        pytest.skip(S3_MISSING)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def counter_ref(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], dict[str, Any]]:
    """Outputs of uninterrupted runs of the counter flow, by its parameter n (cached)."""
    cache: dict[int, dict[str, Any]] = {}

    def ref(n: int) -> dict[str, Any]:
        if n not in cache:
            # A fresh home per try: a reference run cut short (a timeout in the test
            # that asked first) must not make every later test fail with "exists".
            s = Segue(tmp_path_factory.mktemp(f"ref{n}-") / "home")
            s.env.pop("SEGUE_STORE", None)  # the reference is an SQLite run, whoever asks
            run = f"ref{n}"
            s("run", str(FLOWS / "counter.py"), "--run-id", run, "-p", f"n={n}", "-p", "sleep=0",
              check=True)
            cache[n] = {"count": s.output(run, "count"), "report": s.output(run, "report")}
        return cache[n]

    return ref


@pytest.fixture(scope="session")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[pgserver.PgServer | str]:
    """The worker's server, or the reason it cannot run (the tests skip with it)."""
    reason = pgserver.skip_reason()
    try:
        import psycopg_pool  # noqa: F401 - PostgresStore needs it; other server users do not
    except ImportError:
        reason = reason or "psycopg_pool is not installed; pip install 'segue[postgres]'"
    if reason is not None:
        yield reason
        return
    try:
        server = pgserver.PgServer.start()
    except (RuntimeError, OSError) as e:
        yield f"cannot start a throwaway PostgreSQL server: {e}"
        return
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg(pg_server: pgserver.PgServer | str) -> pgserver.PgServer:
    """The worker's PostgreSQL server; the test skips (saying why) where none can run."""
    if isinstance(pg_server, str):
        pytest.skip(pg_server)
    return pg_server
