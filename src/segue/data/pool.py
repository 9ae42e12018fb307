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
from collections.abc import Callable
from typing import Any

from ..executor.pool import ConnectionPool, SubWorkerLost, SubWorkerPool
from ..executor.ray_attempt import RayAttempt

log = logging.getLogger("segue.data")


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
                 gang: int = 0, ray: RayAttempt | None = None) -> SubWorkerPool:
    """Where this attempt's members run: beside it, or, for an attempt that runs on
    Ray (``ray``: what its node's actor told the worker), as Ray actors of their own
    on any node (segue.executor.ray_pool; ``resources``: one member's, ``gang``: a
    gang's size, placed together). The run's worker binds ``ray`` and hands the
    factory to the step's context (``ctx.pool_factory``); this layer reads no
    environment."""
    if ray is not None:
        from ..executor.ray_pool import RayProcessPool

        return RayProcessPool(noun, attempt=ray, resources=resources, gang=gang)
    return LocalProcessPool(target=target, noun=noun)


def pool_for(ctx: Any, noun: str, **kw: Any) -> SubWorkerPool:
    """The members' pool of the attempt ``ctx`` runs: by the factory its worker handed
    the context, else beside this process (a bare context: a direct ``run_map``)."""
    factory = getattr(ctx, "pool_factory", None) or default_pool
    return factory(noun, **kw)
