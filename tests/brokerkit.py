"""Throwaway message brokers for tests: a redis-server on a free loopback port in a temp dir.

    with RedisServer.start(tmp_dir) as rs:
        r = rs.client()
        rs.kill_and_restart()  # SIGKILL, then start again from the append-only file

The server runs with ``appendonly yes`` and ``appendfsync always``: every
write the server acknowledged survives its SIGKILL, which is what the
exactly-once tests need from a broker. :func:`redis_skip_reason` says why a
server cannot be started (the install hint), so tests skip with it rather
than pass silently. No broker is ever mocked.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REDIS_HINT = (
    "install redis-server (Debian/Ubuntu: apt-get install redis-server; `make install-dev` "
    "does it) and redis-py (pip install 'segue[redis]')"
)


def redis_bin() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )


def redis_skip_reason() -> str | None:
    try:
        import redis  # noqa: F401
    except ImportError:
        return f"redis-py is not installed; {REDIS_HINT}"
    if redis_bin() is None:
        return f"no redis-server binary found; {REDIS_HINT}"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    root: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def start(cls, root: str | os.PathLike[str], timeout: float = 30) -> RedisServer:
        server = cls(Path(root), free_port())
        server.root.mkdir(parents=True, exist_ok=True)
        server._spawn(timeout)
        return server

    def _spawn(self, timeout: float) -> None:
        binary = redis_bin()
        if binary is None:
            raise RuntimeError(f"no redis-server; {REDIS_HINT}")
        log = open(self.root / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.root),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--protected-mode",
                "no",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.root / 'redis.log').read_text()[-2000:]}"
                )
            try:
                if self.client().ping():
                    return
            except Exception:  # noqa: BLE001 - not listening yet, or still loading the AOF
                time.sleep(0.05)
        raise RuntimeError(
            f"redis-server did not answer in {timeout}s: "
            f"{(self.root / 'redis.log').read_text()[-2000:]}"
        )

    def client(self) -> Any:
        import redis

        return redis.Redis(
            port=self.port, host="127.0.0.1", decode_responses=True, socket_timeout=30
        )

    def kill(self) -> None:
        """SIGKILL the server (no shutdown, no final fsync) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def kill_and_restart(self, timeout: float = 30) -> None:
        self.kill()
        self._spawn(timeout)  # same port, same dir: it loads the append-only file

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
