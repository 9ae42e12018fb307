"""The ``client`` fixture: the same contract tests against a home and against a real server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from segue.client.base import BaseClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """A real `segue server` subprocess on a free loopback port."""

    def __init__(self, home: Path, pool: Path, *extra: str) -> None:
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = home.parent / f"server-{self.port}.log"
        env = {**os.environ, "SEGUE_POOL": str(pool), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "segue", "--home", str(home), "server", "--port", str(self.port), *extra],
                stdout=out, stderr=subprocess.STDOUT, env=env)
        self.token = self._wait_ready(extra)

    def _wait_ready(self, extra: tuple[str, ...]) -> str | None:
        import httpx

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"segue server exited {self.proc.returncode}: {self.log.read_text()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"segue server did not answer in 60 s: {self.log.read_text()}")
        lines = self.log.read_text().splitlines()
        return None if "--no-auth" in extra else next(x for x in lines if x.startswith("sgt_"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def server(tmp_path: Path, _test_pool: Path) -> Iterator[ServerProcess]:
    srv = ServerProcess(tmp_path / "home", _test_pool)
    yield srv
    srv.stop()


@pytest.fixture(params=["local", "http"])
def client(request: pytest.FixtureRequest, tmp_path: Path, _test_pool: Path) -> Iterator[BaseClient]:
    from segue import Client

    if request.param == "local":
        yield Client(tmp_path / "home", pool=_test_pool)
        return
    srv = ServerProcess(tmp_path / "home", _test_pool)
    try:
        c = Client(srv.url, token=srv.token)
        yield c
        c.close()  # type: ignore[attr-defined]
    finally:
        srv.stop()
