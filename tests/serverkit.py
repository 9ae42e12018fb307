"""A real `segue server` subprocess for tests: start, token, health, stop, kill -9.

    with ServerProcess(home=tmp_path / "home", pool=tmp_path / "pool.db", logs=tmp_path) as srv:
        httpx.get(srv.url + "/api/runs", headers=srv.headers)

The server binds a free 127.0.0.1 port, writes its stderr to a file under
``logs`` (no pipe to fill while a test hammers it), and prints the bootstrap
admin token on line 2 of that stderr at a home's first start; a restarted
server over the same home prints none, so pass the first one's ``token``.
Every wait polls what the process or the socket shows, never a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

TOKEN_HEADER_LINE = "admin token (shown once"


def free_port() -> int:
    """A port nothing listens on now (the kernel's pick); the server may still lose it
    to a race, and :meth:`ServerProcess.start` then tries another."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS of /proc/PID/status), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


class ServerError(RuntimeError):
    pass


class ServerProcess:
    """One `segue --home HOME server` process on 127.0.0.1.

    ``pool``: the host pool file (``$SEGUE_POOL`` of the server and of the
    controllers it spawns). ``token``: the admin token of a home that has
    one already (a restart); otherwise it is read from the bootstrap lines.
    ``port``: a fixed port (a restart on the same URL); default a free one.
    """

    def __init__(self, home: Path, pool: Path, logs: Path, *, token: str | None = None,
                 port: int | None = None, env: dict[str, str] | None = None,
                 startup_timeout: float = 120.0) -> None:
        self.home = Path(home)
        self.pool = Path(pool)
        self.logs = Path(logs)
        self.token = token
        self.port = port
        self.extra_env = dict(env or {})
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr_path: Path | None = None
        self.starts = 0

    # -- addresses ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        if not self.token:
            raise ServerError("no admin token: the home had tokens before this server started; "
                              "pass token= from the first start")
        return {"Authorization": f"Bearer {self.token}"}

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise ServerError("the server was never started")
        return self.proc.pid

    def client(self, token: str | None = None, **kw: Any) -> httpx.Client:
        """An httpx client on the server's URL with ``token`` (default: the admin token).
        Many clients? Pass one ``verify=ssl.create_default_context()`` to all: httpx
        builds a TLS context per client otherwise (tens of ms of CPU each)."""
        headers = {"Authorization": f"Bearer {token}"} if token else self.headers
        return httpx.Client(base_url=self.url, headers=headers, **kw)

    def create_token(self, name: str, role: str = "viewer") -> str:
        """A new token of the home, made by the real CLI (`segue token create`)."""
        proc = subprocess.run(
            [sys.executable, "-m", "segue", "--home", str(self.home), "token", "create", name, "--role", role],
            capture_output=True, text=True, timeout=120, env={**os.environ, "SEGUE_POOL": str(self.pool)})
        if proc.returncode != 0:
            raise ServerError(f"segue token create {name} exited {proc.returncode}: {proc.stderr}")
        return proc.stdout.strip().splitlines()[-1]

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> ServerProcess:
        fixed = self.port is not None
        for _ in range(1 if fixed else 5):  # a free port can be taken between the probe and the bind
            if not fixed:
                self.port = free_port()
            if self._start_once():
                return self
        raise ServerError(f"segue server did not start on 127.0.0.1:{self.port}:\n{self.stderr()}")

    def _start_once(self) -> bool:
        self.starts += 1
        self.logs.mkdir(parents=True, exist_ok=True)
        self.stderr_path = self.logs / f"server-{self.starts}.stderr"
        env = {**os.environ, "SEGUE_POOL": str(self.pool), "PYTHONUNBUFFERED": "1", **self.extra_env}
        env.pop("SEGUE_FAULTS", None)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "segue", "--home", str(self.home), "server", "--port", str(self.port)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "address already in use" in self.stderr().lower():
                    return False
                raise ServerError(f"segue server exited {self.proc.returncode} at start:\n{self.stderr()}")
            if self.token is None:
                self.token = self._read_token()
            if self._healthy():
                if self.token is None:
                    self.token = self._read_token()  # printed before uvicorn binds: there by now
                return True
            time.sleep(0.05)
        self.kill()
        raise ServerError(f"segue server not healthy after {self.startup_timeout}s:\n{self.stderr()}")

    def _read_token(self) -> str | None:
        lines = self.stderr().splitlines()
        if len(lines) >= 2 and lines[0].startswith(TOKEN_HEADER_LINE):
            return lines[1].strip()
        return None

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> int | None:
        """SIGKILL the server and reap it; returns its exit status (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(timeout=60)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (uvicorn shuts down gracefully), then SIGKILL past ``timeout``."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.kill()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
