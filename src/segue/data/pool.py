"""Sub-worker pools: where the sub-workers of a parallel map step run.

This is the executor seam of ``run_map(workers=N)``. The coordinator only
uses :class:`SubWorkerPool` (start, send, recv, stop) and exchanges small
picklable messages with each sub-worker; it never touches a process. The
local implementation runs spawned processes joined by pipes; on Ray
(segue.executor.ray_pool) each member is an actor of its own on any node,
joined by an authenticated socket, and "actor died" is :class:`SubWorkerLost`.

A pool never decides anything about the data: exactly-once lives in the
coordinator's checkpoint and the sinks' two-phase commit.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from .errors import DataError

log = logging.getLogger("segue.data")


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


class LocalProcessPool(ConnectionPool):
    """Sub-workers as local processes of the ``spawn`` context (the coordinator has threads: never fork).

    A fixed map step's sub-workers were usually started already, by the worker at
    its start, forked while it had one thread (segue.executor.local_warm): ``add``
    takes those.
    """

    def __init__(self, target: Callable[..., None] | None = None, noun: str = "sub-worker") -> None:
        # ``target(conn, parent_pid, index, recipe, devices)`` runs in each process:
        # a map step's sub-worker by default, a gang step's rank (run/gang_rank.py).
        super().__init__(noun)
        self._target = target
        self._procs: dict[int, Any] = {}

    def add(self, index: int, recipe: Any, devices: tuple[int, ...] | None) -> None:
        from ..executor import local_warm
        from .subworker import main

        # A map step's sub-worker the worker warmed at its start runs the same entry
        # point over the same kind of pipe; only a member it did not warm starts here.
        warmed = local_warm.take(index, recipe, devices) if self._target is None else None
        if warmed is not None:
            self._procs[index], self._conns[index] = warmed
            log.info("%s %d (pid %d) was warmed with the attempt", self._noun, index, warmed[0].pid)
            return
        mp = multiprocessing.get_context("spawn")
        mine, theirs = mp.Pipe(duplex=True)
        p = mp.Process(target=self._target or main, args=(theirs, os.getpid(), index, recipe, devices),
                       name=f"segue-{self._noun.replace('-', '')}-{index}", daemon=True)
        p.start()
        theirs.close()  # so that the sub-worker's death reads as EOF here
        self._procs[index] = p
        self._conns[index] = mine

    @property
    def pids(self) -> list[int]:
        return [p.pid for _, p in sorted(self._procs.items())]

    def _lost(self, i: int, why: str) -> SubWorkerLost:
        p = self._procs[i]
        p.join(0.5)
        return SubWorkerLost(f"{self._noun} {i} (pid {p.pid}) {why} (exit code {p.exitcode}); "
                             f"the attempt is retried from the last checkpoint")

    def remove(self, index: int) -> None:
        p, c = self._procs.pop(index, None), self._conns.pop(index, None)
        self._leaving.discard(index)
        if p is not None:
            p.join(5.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        if c is not None:
            c.close()

    def stop(self) -> None:
        for c in self._conns.values():
            try:
                c.send(("stop",))
            except (OSError, EOFError):
                pass
        for p in self._procs.values():
            p.join(2.0)
            if p.is_alive():
                p.kill()
                p.join(2.0)
        for c in self._conns.values():
            c.close()
        self._procs, self._conns, self._leaving = {}, {}, set()
        if self._target is None:
            from ..executor import local_warm

            local_warm.release()  # warmed for this step and never needed


def default_pool(noun: str, *, target: Callable[..., None] | None = None, resources: Any = None,
                 gang: int = 0) -> SubWorkerPool:
    """Where this attempt's members run: beside it, or, for an attempt that runs on
    Ray (``$SEGUE_RAY_ATTEMPT``), as Ray actors of their own on any node
    (segue.executor.ray_pool; ``resources``: one member's, ``gang``: a gang's size,
    placed together)."""
    address = os.environ.get("SEGUE_RAY_ATTEMPT")
    if address:
        from ..executor.ray_pool import RayProcessPool

        return RayProcessPool(noun, address=address, resources=resources, gang=gang)
    return LocalProcessPool(target=target, noun=noun)
