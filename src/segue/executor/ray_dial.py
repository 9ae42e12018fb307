"""Where an attempt's warmed members dial on Ray: a listener opened before its worker starts.

Without this, a data step's warmed sub-workers (executor.ray) learn where to
dial only from the attempt's worker, once it has imported Ray and joined the
cluster: half a second or more of start-up on the path to the first record.
So the attempt's actor (executor.ray_node), which is in Ray already, opens the
worker's listener itself, on its node, with a fresh secret key; tells the
warmed members to dial it at once; and hands both to the worker it starts:
the socket as an inherited descriptor, the key through a pipe (never an
environment variable, which other processes of the user may read). A member
that dials before the worker accepts waits in the listen backlog. The worker
(executor.ray_pool) accepts on the socket as soon as it has imported what it
needs, and joins Ray in the background, for what only Ray knows (a member's
actor lost with its node, its output).

The handshake is ``multiprocessing.connection``'s, so a process without the
key is refused before anything it sends is unpickled.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

ENV = "SEGUE_RAY_DIAL"  # "SOCKET_FD,KEY_FD" in the worker's environment
KEY_BYTES = 32


def open_listener(host: str, backlog: int) -> tuple[socket.socket, bytes]:
    """A TCP listener on ``host`` (any free port) and a fresh key for it."""
    sock = socket.create_server((host, 0), backlog=backlog)
    return sock, secrets.token_bytes(KEY_BYTES)


def hand_over(sock: socket.socket, key: bytes) -> tuple[dict[str, str], tuple[int, int], int]:
    """What a child needs to accept on ``sock``: its environment entry, the descriptors
    to pass (``pass_fds``), and the pipe's read end, which the parent closes once the
    child started (the key already waits in the pipe)."""
    r, w = os.pipe()
    try:
        os.write(w, key)
    finally:
        os.close(w)
    return {ENV: f"{sock.fileno()},{r}"}, (sock.fileno(), r), r


class DialListener:
    """``multiprocessing.connection.Listener``'s accept, on a socket this process inherited."""

    def __init__(self, sock: socket.socket, key: bytes) -> None:
        self._sock, self.key = sock, key
        host, port = sock.getsockname()[:2]
        self.address: tuple[str, int] = (host, int(port))

    @classmethod
    def inherited(cls) -> DialListener | None:
        """The listener the attempt's actor handed this process, taken once; None without one."""
        spec = os.environ.pop(ENV, "")
        if not spec:
            return None
        sock_fd, key_fd = (int(x) for x in spec.split(","))
        try:
            key = os.read(key_fd, KEY_BYTES)
        finally:
            os.close(key_fd)
        if len(key) != KEY_BYTES:
            os.close(sock_fd)
            raise RuntimeError(f"the key of the inherited listener ({ENV}) is {len(key)} bytes, "
                               f"not {KEY_BYTES}: the attempt's actor did not hand it over whole")
        return cls(socket.socket(fileno=sock_fd), key)

    def accept(self) -> Connection:
        """The next member that proves it has the key (others raise, as Listener's do)."""
        s, _ = self._sock.accept()
        conn = Connection(s.detach())
        try:
            deliver_challenge(conn, self.key)
            answer_challenge(conn, self.key)
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes an accept() blocked in another thread
        self._sock.close()
