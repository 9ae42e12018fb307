"""Wake-ups by LISTEN/NOTIFY, with polling as the fallback.

Every event of a run itself (one without a step: its state, its controller's
lease, its options) that a PostgreSQL store appends notifies ``segue_events``
with its run id in the same transaction (``postgres_schema.insert_event``), so a
waiter learns of a change the moment it commits: an agent sees a controller
release its run at once instead of at its next poll. A step's events (task
transitions, checkpoints) notify nobody: the waiters (agents) wait for runs, and
a NOTIFY serialises commits across the whole server (it holds a global lock from
before its transaction's commit record until it is durable). Notifications are a hint, never the truth:
they are lost across reconnects and do not pass transaction-pooling proxies, so
every waiter still polls, and :meth:`Listener.wait` only shortens the sleep.

One listener per process and store, on a connection of its own (a pooled
connection cannot keep a LISTEN). Any failure closes it and the wait falls back
to sleeping; the next wait connects again.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from .postgres_schema import EVENTS_CHANNEL

log = logging.getLogger("segue.store")


class Listener:
    def __init__(self, url: str, connect_kwargs: dict[str, Any]) -> None:
        self.url, self._kwargs = url, connect_kwargs
        self._conn: Any = None
        self._pid = 0
        self._lock = threading.Lock()
        self.woken = 0  # notifications received (the tests read it)
        self.failures = 0  # connections lost or refused (each one a fall back to polling)

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for any run's event; True if one arrived
        (pending ones count), False after the timeout or when the listener is down
        (then it has slept the timeout)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            conn = self._connect()
            if conn is not None:
                try:
                    got = sum(1 for _ in conn.notifies(timeout=max(0.0, timeout), stop_after=1))
                    if got:
                        # Drain what else arrived with it: one wake-up per burst.
                        got += sum(1 for _ in conn.notifies(timeout=0.0))
                    self.woken += got
                    return got > 0
                except Exception as exc:  # noqa: BLE001 - any failure: back to polling
                    self._drop(exc)
        time.sleep(max(0.0, deadline - time.monotonic()))
        return False

    def _connect(self) -> Any:
        if self._conn is not None and self._pid == os.getpid() and not self._conn.closed:
            return self._conn
        self._conn = None  # a connection inherited over fork() is the parent's: leave it
        try:
            import psycopg

            conn = psycopg.connect(self.url, **{**self._kwargs, "autocommit": True,
                                                "application_name": "segue-listen"})
            conn.execute(f"LISTEN {EVENTS_CHANNEL}")  # a constant of this package
        except Exception as exc:  # noqa: BLE001 - the server may be down: poll meanwhile
            self._drop(exc)
            return None
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _drop(self, exc: BaseException) -> None:
        self.failures += 1
        log.info("store notifications unavailable (%s); polling", str(exc).strip() or type(exc).__name__)
        conn, self._conn = self._conn, None
        if conn is not None and self._pid == os.getpid():
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - already broken
                pass

    def close(self) -> None:
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()
