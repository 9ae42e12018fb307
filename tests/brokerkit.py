"""Throwaway message brokers for tests, each on free loopback ports in a temp dir.

    with RedisServer.start(tmp_dir) as rs:
        r = rs.client()
        rs.kill_and_restart()  # SIGKILL, then start again from the append-only file

    with RabbitMQServer.start(tmp_dir) as mq:
        ch = mq.channel()
        mq.kill_and_restart()  # SIGKILL the node, then start it again on its data dir

The Redis server runs with ``appendonly yes`` and ``appendfsync always``:
every write the server acknowledged survives its SIGKILL, which is what the
exactly-once tests need from a broker. The RabbitMQ node is a node of its
own (unique name, its own epmd on a free port, AMQP, distribution and epmd
on loopback only, no plugins, data and logs in the temp dir). The
``*_skip_reason`` functions say why a server cannot be started (the install
hint), so tests skip with it rather than pass silently. No broker is ever
mocked.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

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


def serve(start: Callable[[Path], Any], why: str | None, root: Path) -> Iterator[Any]:
    """A fixture's broker: skipped with ``why`` (the install hint), else started in ``root``
    and stopped after the test or module."""
    if why:
        pytest.skip(why)
    server = start(root)
    try:
        yield server
    finally:
        server.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listen_port() -> int:
    """A free loopback port below the ephemeral range, for a server that binds it seconds
    later: an ephemeral port (``free_port``) may meanwhile be taken by any outgoing
    connection on the machine, one below that range only by another listener."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    return free_port()


def _wait_until(ready: Any, proc: Any, log: Path, what: str, timeout: float) -> None:
    """Poll ``ready()`` until it is true; fail with the log's tail if ``proc`` exits or time is up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            if ready():
                return
        except Exception:  # noqa: BLE001 - not listening yet, or still loading its data
            pass
        time.sleep(0.05)
    raise RuntimeError(
        f"{what} did not answer in {timeout}s: {log.read_text(errors='replace')[-2000:]}"
    )


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
        _wait_until(
            lambda: self.client().ping(), self.proc, self.root / "redis.log", "redis-server", timeout
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


RABBITMQ_HINT = (
    "install rabbitmq-server (Debian/Ubuntu: apt-get install rabbitmq-server; `make install-dev` "
    "does it) and pika (pip install 'segue[amqp]')"
)
RABBITMQ_LIB = Path("/usr/lib/rabbitmq/bin")


def rabbitmq_bin(name: str = "rabbitmq-server") -> str | None:
    """The node's own script (the /usr/sbin wrapper would switch to the rabbitmq user)."""
    if (RABBITMQ_LIB / name).exists():
        return str(RABBITMQ_LIB / name)
    return shutil.which(name)


def rabbitmq_skip_reason() -> str | None:
    try:
        import pika  # noqa: F401
    except ImportError:
        return f"pika is not installed; {RABBITMQ_HINT}"
    if rabbitmq_bin() is None or rabbitmq_bin("rabbitmqctl") is None:
        return f"no rabbitmq-server binary found; {RABBITMQ_HINT}"
    if shutil.which("epmd") is None:
        return f"no epmd (Erlang) found; {RABBITMQ_HINT}"
    return None


@dataclass
class RabbitMQServer:
    """A RabbitMQ node of its own: AMQP on ``port``; its epmd and distribution on free ports."""

    root: Path
    port: int
    dist_port: int
    epmd_port: int
    name: str
    proc: subprocess.Popen[bytes] | None = None
    epmd: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @classmethod
    def start(cls, root: str | os.PathLike[str], timeout: float = 60) -> RabbitMQServer:
        for attempt in range(3):  # a port taken between our check and the node's bind: again
            ports = [listen_port() for _ in range(3)]
            name = f"segue-test-{os.getpid()}-{ports[0]}@localhost"
            server = cls(Path(root), ports[0], ports[1], ports[2], name)
            server.root.mkdir(parents=True, exist_ok=True)
            (server.root / "rabbitmq.conf").write_text(
                f"listeners.tcp.default = 127.0.0.1:{server.port}\n"
            )
            (server.root / "enabled_plugins").write_text("[].\n")
            try:
                server._start_epmd()
                server._spawn(timeout)
                return server
            except RuntimeError as exc:
                server.stop()
                if "eaddrinuse" not in str(exc) or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def env(self) -> dict[str, str]:
        r = str(self.root)
        return {
            **os.environ,
            "HOME": r,  # the Erlang cookie lives here, shared by the node and rabbitmqctl
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "RABBITMQ_CONFIG_FILE": f"{r}/rabbitmq",
            "RABBITMQ_ADVANCED_CONFIG_FILE": f"{r}/advanced.config",
            "RABBITMQ_ENABLED_PLUGINS_FILE": f"{r}/enabled_plugins",
            "RABBITMQ_PLUGINS_EXPAND_DIR": f"{r}/plugins-expand",
            "RABBITMQ_MNESIA_BASE": f"{r}/mnesia",
            "RABBITMQ_LOG_BASE": f"{r}/log",
            "RABBITMQ_PID_FILE": f"{r}/rabbitmq.pid",
        }

    def _start_epmd(self) -> None:
        """Our own epmd, in the foreground, so stopping the node stops it too."""
        self.epmd = subprocess.Popen(
            ["epmd", "-port", str(self.epmd_port), "-address", "127.0.0.1"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _spawn(self, timeout: float) -> None:
        binary = rabbitmq_bin()
        if binary is None:
            raise RuntimeError(f"no rabbitmq-server; {RABBITMQ_HINT}")
        log = open(self.root / "server.log", "ab")
        self.proc = subprocess.Popen(
            [binary], stdout=log, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True
        )
        log.close()
        _wait_until(self._ready, self.proc, self.root / "server.log", "rabbitmq-server", timeout)

    def _ready(self) -> bool:
        self.connection().close()
        return True

    def connection(self) -> Any:
        import pika

        return pika.BlockingConnection(pika.URLParameters(self.url))

    def ctl(self, *args: str, timeout: float = 60) -> str:
        ctl = rabbitmq_bin("rabbitmqctl")
        assert ctl is not None
        proc = subprocess.run(
            [ctl, "-n", self.name, *args], env=self.env(), capture_output=True, text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"rabbitmqctl {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    def declare(self, queue: str, kind: str = "quorum") -> None:
        """A durable queue of ``kind`` (quorum or classic), emptied if it existed."""
        conn = self.connection()
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": kind})
        ch.queue_purge(queue)
        conn.close()

    def publish(self, queue: str, bodies: Any, ids: Any = None) -> None:
        """Persistent messages with ``message_id`` from ``ids`` (None: without), all confirmed.

        Published in one go and confirmed as the broker confirms them (an unconfirmed
        publish may be dropped, and one confirm at a time costs a disk sync each).
        """
        import pika

        raws = [b if isinstance(b, bytes) else b.encode() for b in bodies]
        outstanding = set(range(1, len(raws) + 1))
        nacked: list[int] = []

        def on_confirm(frame: Any) -> None:
            tag, multiple = frame.method.delivery_tag, frame.method.multiple
            done = {t for t in outstanding if t <= tag} if multiple else {tag}
            if isinstance(frame.method, pika.spec.Basic.Nack):
                nacked.extend(done)
            outstanding.difference_update(done)
            if not outstanding:
                conn.close()

        def on_channel(ch: Any) -> None:
            ch.confirm_delivery(on_confirm)
            for n, raw in enumerate(raws):
                mid = None if ids is None else ids[n]
                props = pika.BasicProperties(delivery_mode=2, message_id=mid)
                ch.basic_publish("", queue, raw, props)
            if not raws:
                conn.close()

        conn = pika.SelectConnection(
            pika.URLParameters(self.url),
            on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
            on_open_error_callback=lambda c, exc: c.ioloop.stop(),
            on_close_callback=lambda c, reason: c.ioloop.stop(),
        )
        try:
            conn.ioloop.start()
        finally:
            conn.ioloop.close()
        assert not outstanding and not nacked, (
            f"{len(outstanding)} publishes unconfirmed, {len(nacked)} refused"
        )

    def counts(self, queue: str) -> tuple[int, int]:
        """(ready, consumers) of ``queue`` (a passive declare: exact, where the management
        statistics lag). With no consumer left, a message nobody acked is ready again, so
        ``(0, 0)`` means nothing is ready and nothing is unacknowledged."""
        conn = self.connection()
        try:
            ok = conn.channel().queue_declare(queue, passive=True).method
        finally:
            conn.close()
        return int(ok.message_count), int(ok.consumer_count)

    def kill(self) -> None:
        """SIGKILL the node (no shutdown) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def kill_and_restart(self, timeout: float = 60) -> None:
        self.kill()
        self._spawn(timeout)  # same name, ports and data dir: durable queues come back

    def stop(self) -> None:
        self.kill()  # a throwaway node: nothing to flush
        if self.epmd is not None and self.epmd.poll() is None:
            self.epmd.kill()
            self.epmd.wait(30)

    def __enter__(self) -> RabbitMQServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
