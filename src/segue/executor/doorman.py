"""Where a step's members on other nodes dial in: a TCP listener that no caller can hold up.

``multiprocessing.connection.Listener(authkey=...)`` runs the key's challenge
inside ``accept()``, so one caller that connects and then says nothing (a port
scanner, a health check, a stuck process) stops every later member from being
admitted, for ever. The :class:`Doorman` accepts the TCP connection only, and
greets each caller in a thread of its own: the key's challenge both ways (a
caller without the key is refused before anything it sends is unpickled), then
its first message, all within ``greet_s``; a caller that is silent past it is
hung up on. Whoever passes is handed to ``on_greeted``, never after ``close()``
has returned.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any

GREET_S = 30.0  # a caller must prove the key and say its first word within this


class Doorman:
    """Listens on ``(host, 0)``; calls ``on_greeted(conn, first_message)`` for each caller
    that proves ``key`` and sends a message within ``greet_s``."""

    def __init__(self, host: str, key: bytes, on_greeted: Callable[[Connection, Any], None],
                 greet_s: float = GREET_S) -> None:
        self._key, self._on_greeted, self._greet_s = key, on_greeted, greet_s
        self._sock = socket.create_server((host, 0), backlog=64)  # the challenge runs in _greet
        addr = self._sock.getsockname()
        self.address: tuple[str, int] = (str(addr[0]), int(addr[1]))
        self._closed = False
        self._lock = threading.Lock()
        self._callers: set[Connection] = set()  # not greeted yet
        self.refused = 0  # callers hung up on: without the key, or silent too long
        threading.Thread(target=self._accept, name="segue-doorman", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._sock.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)  # out of descriptors, say: not a busy loop meanwhile
                continue
            conn = Connection(sock.detach())
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._callers.add(conn)
            threading.Thread(target=self._greet, args=(conn,), name="segue-doorman-greet",
                             daemon=True).start()

    def _greet(self, conn: Connection) -> None:
        timer = threading.Timer(self._greet_s, self._hang_up, args=(conn,))
        timer.start()
        try:
            deliver_challenge(conn, self._key)  # a stranger fails here, unpickled nothing
            answer_challenge(conn, self._key)
            first = conn.recv()
        except Exception:  # noqa: BLE001 - no key, hung up on, gone: nothing to admit
            with self._lock:
                self._callers.discard(conn)
                self.refused += 1
            conn.close()
            return
        finally:
            timer.cancel()
        with self._lock:  # handed over under the lock: close() waits for it, then none follow
            if conn not in self._callers:  # hung up on as it answered: too late
                conn.close()
                return
            self._callers.discard(conn)
            self._on_greeted(conn, first)

    def _hang_up(self, conn: Connection) -> None:
        """A caller silent too long: end its connection (its greeting thread unwinds)."""
        with self._lock:
            if conn in self._callers:
                self._callers.discard(conn)
                _shut(conn)

    def close(self) -> None:
        """Stop listening, and hang up on every caller not greeted yet."""
        with self._lock:
            self._closed = True
            for conn in self._callers:
                _shut(conn)
            self._callers.clear()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in _accept
        self._sock.close()


def _shut(conn: Connection) -> None:
    """End ``conn`` under a read blocked on it in another thread: shutdown() wakes the
    reader, close() alone would not (the reader closes it as it unwinds)."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(conn.fileno())) as s:
        s.shutdown(socket.SHUT_RDWR)
