"""The sub-worker pool seam: members addressed by index, each a FIFO message channel.

The data layer's coordinator (``run_map(workers=N)``) and a gang's ranks
(``segue.run.gang``) use only :class:`SubWorkerPool` (start, send, recv, stop)
and exchange small picklable messages with each member; they never touch a
process. :class:`ConnectionPool` is the reading, sending and retiring every
pool over ``multiprocessing`` connections shares: local spawned processes
(``segue.data.pool.LocalProcessPool``) and Ray actors (``segue.executor.ray_pool``),
where "actor died" is :class:`SubWorkerLost`.

A pool never decides anything about the data: exactly-once lives in the
coordinator's checkpoint and the sinks' two-phase commit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from ..errors import DataError


class SubWorkerLost(DataError):
    """A sub-worker died or failed; the attempt fails and is retried from the last checkpoint."""

    segue_retryable = True


class SubWorkerPool(ABC):
    """Sub-workers addressed by index, each a FIFO message channel both ways.

    Indexes are the step's sub-worker slots (0..max-1): an elastic step adds and
    retires sub-workers while it runs, so the live ones need not be contiguous.
    """

    def start(self, n: int, recipe: Any) -> None:
        """Start sub-workers 0..n-1 seeing the step's devices."""
        for i in range(n):
            self.add(i, recipe, None)

    @abstractmethod
    def add(self, index: int, recipe: Any, devices: tuple[int, ...] | None) -> None:
        """Start sub-worker ``index``; it rebuilds source, function and sinks from ``recipe``
        and sees only ``devices`` (None or (): the step's own)."""

    @abstractmethod
    def leaving(self, index: int) -> None:
        """Sub-worker ``index`` was told to exit (it retires): its end is not a loss."""

    @abstractmethod
    def send(self, index: int, message: tuple[Any, ...]) -> None:
        """Queue ``message`` to sub-worker ``index``; SubWorkerLost if it is gone."""

    @abstractmethod
    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        """Messages that arrived within ``timeout`` seconds, in each sub-worker's order.

        Raises SubWorkerLost when a sub-worker exited or reported an error.
        """

    @abstractmethod
    def remove(self, index: int) -> None:
        """Forget sub-worker ``index``, stopping it if it still runs."""

    @abstractmethod
    def stop(self) -> None:
        """Stop every sub-worker (politely, then by force); idempotent."""


class ConnectionPool(SubWorkerPool):
    """Members reached through ``multiprocessing`` connections (pipes or sockets):
    the reading, sending and retiring that every such pool shares."""

    def __init__(self, noun: str) -> None:
        self._noun = noun
        self._conns: dict[int, Connection] = {}
        self._leaving: set[int] = set()

    @abstractmethod
    def _lost(self, i: int, why: str) -> SubWorkerLost:
        """The error that says member ``i`` is gone (``why``), with what is known of its end."""

    def leaving(self, index: int) -> None:
        self._leaving.add(index)

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        try:
            self._conns[index].send(message)
        except (OSError, EOFError, KeyError):
            raise self._lost(index, "is gone") from None

    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        index = {id(c): i for i, c in self._conns.items()}
        out: list[tuple[int, tuple[Any, ...]]] = []
        for ready in wait(list(self._conns.values()), timeout):
            c = cast(Connection, ready)  # wait() returns the connections it was given
            i = index[id(c)]
            while True:
                try:
                    msg = c.recv()
                except (OSError, EOFError):
                    if i in self._leaving:
                        self.remove(i)  # a retired sub-worker exited, as told
                        break
                    if out:  # its last words first (a rank's "done"); the end, next call
                        break
                    raise self._lost(i, "exited") from None
                if msg[0] == "error":
                    raise SubWorkerLost(f"{self._noun} {i} failed: {msg[1]}")
                out.append((i, msg))
                if not c.poll():
                    break
        return out
