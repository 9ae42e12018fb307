"""Sub-worker pools: where the sub-workers of a parallel map step run.

This is the executor seam of ``run_map(workers=N)``. The coordinator only
uses :class:`SubWorkerPool` (start, send, recv, stop) and exchanges small
picklable messages with each sub-worker; it never touches a process. The
local implementation runs spawned processes joined by pipes; a Ray
implementation would start N actors running :func:`segue.data.subworker.serve`
over a queue pair and map "actor died" to :class:`SubWorkerLost`.

A pool never decides anything about the data: exactly-once lives in the
coordinator's checkpoint and the sinks' two-phase commit.
"""

from __future__ import annotations

import multiprocessing
import os
from abc import ABC, abstractmethod
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from .errors import DataError


class SubWorkerLost(DataError):
    """A sub-worker died or failed; the attempt fails and is retried from the last checkpoint."""

    segue_retryable = True


class SubWorkerPool(ABC):
    """N sub-workers addressed by index 0..N-1, each a FIFO message channel both ways."""

    @abstractmethod
    def start(self, n: int, recipe: Any) -> None:
        """Start ``n`` sub-workers; each rebuilds its source, function and sinks from ``recipe``."""

    @abstractmethod
    def send(self, index: int, message: tuple[Any, ...]) -> None:
        """Queue ``message`` to sub-worker ``index``; SubWorkerLost if it is gone."""

    @abstractmethod
    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        """Messages that arrived within ``timeout`` seconds, in each sub-worker's order.

        Raises SubWorkerLost when a sub-worker exited or reported an error.
        """

    @abstractmethod
    def stop(self) -> None:
        """Stop every sub-worker (politely, then by force); idempotent."""


class LocalProcessPool(SubWorkerPool):
    """Sub-workers as local processes of the ``spawn`` context (the coordinator has threads: never fork)."""

    def __init__(self) -> None:
        self._procs: list[Any] = []
        self._conns: list[Connection] = []

    def start(self, n: int, recipe: Any) -> None:
        from .subworker import main

        mp = multiprocessing.get_context("spawn")
        for i in range(n):
            mine, theirs = mp.Pipe(duplex=True)
            p = mp.Process(target=main, args=(theirs, os.getpid(), i, recipe),
                           name=f"segue-subworker-{i}", daemon=True)
            p.start()
            theirs.close()  # so that the sub-worker's death reads as EOF here
            self._procs.append(p)
            self._conns.append(mine)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def _lost(self, i: int, why: str) -> SubWorkerLost:
        p = self._procs[i]
        p.join(0.5)
        return SubWorkerLost(f"sub-worker {i} (pid {p.pid}) {why} (exit code {p.exitcode}); "
                             f"the attempt is retried from the last checkpoint")

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        try:
            self._conns[index].send(message)
        except (OSError, EOFError):
            raise self._lost(index, "is gone") from None

    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        index = {id(c): i for i, c in enumerate(self._conns)}
        out: list[tuple[int, tuple[Any, ...]]] = []
        for ready in wait(self._conns, timeout):
            c = cast(Connection, ready)  # wait() returns the connections it was given
            i = index[id(c)]
            while True:
                try:
                    msg = c.recv()
                except (OSError, EOFError):
                    raise self._lost(i, "exited") from None
                if msg[0] == "error":
                    raise SubWorkerLost(f"sub-worker {i} failed: {msg[1]}")
                out.append((i, msg))
                if not c.poll():
                    break
        return out

    def stop(self) -> None:
        for c in self._conns:
            try:
                c.send(("stop",))
            except (OSError, EOFError):
                pass
        for p in self._procs:
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for c in self._conns:
            c.close()
        self._procs, self._conns = [], []
