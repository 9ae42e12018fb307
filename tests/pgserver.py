"""A throwaway PostgreSQL server for tests: initdb + pg_ctl on loopback in a temp dir.

    with PgServer.start(tmp_dir) as pg:
        url = pg.create_database()  # a fresh, empty database
        pg.restart()  # a crash and a restart: every session is cut off

Finds the server binaries on PATH or in /usr/lib/postgresql/*/bin. initdb
refuses to run as root, so as root the cluster is created and run as the
``nobody`` user (through ``runuser`` or ``setpriv``). :func:`skip_reason`
says why a server cannot be started, with the install hint, so tests can
skip with it rather than pass silently.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

INSTALL_HINT = ("install the PostgreSQL server binaries (Debian/Ubuntu: apt-get install postgresql; "
                "Fedora: dnf install postgresql-server; macOS: brew install postgresql) and psycopg "
                "(pip install 'psycopg[binary,pool]')")


def find_bin_dir() -> Path | None:
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2].split(".")[0]))
    for d in reversed(dirs):
        if os.path.exists(os.path.join(d, "initdb")):
            return Path(d)
    return None


def _as_user_prefix() -> list[str]:
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser"):
        return ["runuser", "-u", "nobody", "--"]
    if shutil.which("setpriv"):
        import pwd

        pw = pwd.getpwnam("nobody")
        return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
    raise RuntimeError("running as root needs runuser or setpriv to start PostgreSQL as 'nobody'")


def skip_reason() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return f"psycopg is not installed; {INSTALL_HINT}"
    if find_bin_dir() is None:
        return f"no PostgreSQL server binaries (initdb, pg_ctl) found; {INSTALL_HINT}"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PgServer:
    root: Path
    port: int
    bin_dir: Path
    prefix: list[str]
    opts: str = ""  # the server's -c settings, given again on restart

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql://segue@127.0.0.1:{self.port}/{dbname}"

    def create_database(self) -> str:
        """A fresh, empty database (``t_<random>``); returns its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            # FILE_COPY (the only way before 15) is several times faster than
            # WAL_LOG for the tiny template, with fsync off.
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(f"CREATE DATABASE {name}{strategy}")  # a generated identifier, not input
        return self.url_for(name)

    def drop_database(self, url: str) -> None:
        """Drop a database made by :meth:`create_database`, cutting off its sessions."""
        import psycopg

        name = url.rsplit("/", 1)[1]
        if not name.startswith("t_") or not name[2:].isalnum():
            raise ValueError(f"not a test database: {url}")
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def restart(self, mode: str = "immediate", timeout: float = 60) -> None:
        """Stop the server (``immediate``: as a crash; ``fast``: a clean shutdown), start
        it again on the same port, and return once it accepts connections."""
        out = subprocess.run([*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"),
                              "-l", str(self.root / "log"), "-o", self.opts, "-m", mode, "-w",
                              "-t", str(int(timeout)), "restart"],
                             capture_output=True, text=True, timeout=timeout)
        if out.returncode:
            raise RuntimeError(f"pg_ctl restart failed: {out.stderr.strip()[-300:]} {self._log_tail()}")
        self._wait(timeout)

    def _log_tail(self) -> str:
        log = self.root / "log"
        return log.read_text()[-800:] if log.exists() else ""

    @classmethod
    def start(cls, parent: str | os.PathLike[str] | None = None, timeout: float = 60, *,
              durable: bool = False) -> PgServer:
        """``durable``: commits are fsynced (as a production server, and as SQLite's
        synchronous=FULL); tests leave it off for speed."""
        bin_dir = find_bin_dir()
        if bin_dir is None:
            raise RuntimeError(f"no PostgreSQL server binaries; {INSTALL_HINT}")
        prefix = _as_user_prefix()
        # A fresh directory under /tmp: 'nobody' must be able to reach it, and
        # socket paths must stay short.
        root = Path(tempfile.mkdtemp(prefix="segue-pg-", dir=parent))
        os.chmod(root, 0o755)
        data = root / "data"
        data.mkdir()
        if prefix:
            import pwd

            pw = pwd.getpwnam("nobody")
            os.chown(root, pw.pw_uid, pw.pw_gid)
            os.chown(data, pw.pw_uid, pw.pw_gid)
            for p in Path(root).parents:  # nobody must traverse the path
                if p != Path("/") and not os.stat(p).st_mode & 0o001:
                    raise RuntimeError(f"{p} is not traversable by 'nobody'; pass another parent directory")
        run = dict(capture_output=True, text=True, timeout=timeout)
        out = subprocess.run([*prefix, str(bin_dir / "initdb"), "-D", str(data), "-U", "segue",
                              "--auth=trust", "--no-sync", "-E", "UTF8"], **run)
        if out.returncode:
            raise RuntimeError(f"initdb failed: {out.stderr.strip()[-500:]}")
        port = _free_port()
        sync = "-c fsync=on -c synchronous_commit=on" if durable else "-c fsync=off -c full_page_writes=off"
        opts = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={root} "
                f"{sync} -c max_connections=100")
        out = subprocess.run([*prefix, str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "log"),
                              "-o", opts, "-w", "-t", str(int(timeout)), "start"], **run)
        server = cls(root, port, bin_dir, prefix, opts)
        if out.returncode:
            raise RuntimeError(f"pg_ctl start failed: {out.stderr.strip()[-300:]} {server._log_tail()}")
        server._wait(timeout)
        return server

    def _wait(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        subprocess.run([*self.prefix, str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-m",
                        "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PgServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
