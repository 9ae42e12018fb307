"""Warmed members of a local attempt: a data step's sub-workers, started with the worker.

A data step with a fixed number of sub-workers (:func:`segue.executor.base.warm_members`)
has them started by its worker process first thing (``segue._worker_main --warm N``),
before the worker reads the store, loads the flow or starts a thread.

On Linux the worker imports the members' entry point and then *forks* them: a member
starts with every module it needs already imported, at the cost of a fork, and no
``multiprocessing`` resource tracker is started. A ``spawn`` member costs an
interpreter start and ~0.2 s of imports, which on two cores ran beside the
worker's own imports and put a two-worker step's first record ~0.1 s later than
forked members do (0.51 s against 0.41 s after the task's start). Forking is safe
only in a process with one thread and no open store connection, which is why it
happens right here; a process that already runs threads (or a platform without
``fork``) gets ``spawn`` members, which import the entry point while the worker
starts. It is the local twin of the Ray executor's warmed actors.

Each member waits on its pipe for ``("start", index, recipe, devices)``;
:class:`segue.data.pool.LocalProcessPool` takes them by index, once each
(:func:`take`), and a member it never takes is stopped with the pool
(:func:`release`) or dies with the worker (``PR_SET_PDEATHSIG``; the pipe's EOF).
A member runs exactly the entry point a cold one runs, over the same pipe: it
decides nothing, and it sees no devices until its recipe names them (the entry
point sets ``CUDA_VISIBLE_DEVICES`` before the flow, or any framework, loads).

The members live in this module's table because they belong to the process: the
worker started them before any object that could hold them existed.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

# What a step's member process runs, by name: a child imports only the one it needs
# (here, and executor.ray_member on Ray). Nothing else of segue is imported at the top
# of this module: the worker imports it before anything, and so does a spawned member.
MEMBER_TARGETS = {"sub-worker": ("segue.data.subworker", "main"), "rank": ("segue.run.gang_rank", "main")}

_members: dict[int, tuple[Any, Connection]] = {}


def warm(n: int, kind: str = "sub-worker") -> str:
    """Start ``n`` members of ``kind`` (indexes 0..n-1) for this process to take; returns
    the start method used ("fork" or "spawn")."""
    import importlib

    method = start_method()
    forked = method == "fork"
    if forked:
        importlib.import_module(MEMBER_TARGETS[kind][0])  # the members inherit it
    mp: Any = multiprocessing.get_context(method)
    for index in range(n):
        mine, theirs = mp.Pipe(duplex=True)
        # A forked member inherits this process's end of its own pipe and of those of the
        # members forked before it: it closes them, so that each member reads EOF when
        # this process closes its end (or ends).
        others = [mine, *(c for _, c in _members.values())] if forked else []
        proc = mp.Process(target=_member, args=(theirs, os.getpid(), kind, others),
                          name=f"segue-{kind.replace('-', '')}-{index}", daemon=True)
        proc.start()
        theirs.close()  # so that the member's death reads as EOF here
        _members[index] = (proc, mine)
    return method


def start_method() -> str:
    """"fork" where it is safe here (Linux, one thread), else "spawn"."""
    import threading

    ok = sys.platform.startswith("linux") and threading.active_count() == 1
    return "fork" if ok and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def take(index: int, recipe: Any, devices: tuple[int, ...] | None) -> tuple[Any, Connection] | None:
    """Member ``index``, started on ``recipe`` with ``devices``, as (process, connection);
    None when none was warmed for it or it died waiting (start a cold one)."""
    got = _members.pop(index, None)
    if got is None:
        return None
    proc, conn = got
    try:
        conn.send(("start", index, recipe, devices))
    except OSError:
        _end(proc, conn)
        return None
    return proc, conn


def release() -> None:
    """Stop every member not taken (the step needed fewer, or none); idempotent."""
    while _members:
        _end(*_members.popitem()[1])


def warmed() -> dict[int, int]:
    """The members waiting to be taken: index -> pid."""
    return {i: proc.pid for i, (proc, _) in sorted(_members.items())}


def _end(proc: Any, conn: Connection) -> None:
    conn.close()  # EOF: a waiting member returns at once
    proc.join(2.0)
    if proc.is_alive():
        proc.kill()
        proc.join(2.0)


def _member(conn: Connection, parent_pid: int, kind: str, others: list[Connection]) -> None:
    """A member process: import the entry point (a forked one has it), wait for the
    recipe, run it."""
    import importlib

    for c in others:
        c.close()

    # The worker ignores these until its handlers are installed, and an ignored
    # signal stays ignored across exec: a member gets the default a cold one has.
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    from .._procs import die_with_parent

    die_with_parent(parent_pid, 3)
    module, name = MEMBER_TARGETS[kind]
    entry = getattr(importlib.import_module(module), name)  # while the worker starts
    try:
        msg = conn.recv()
    except (EOFError, OSError):
        return  # not needed: the pool released it, or the worker ended
    if msg[0] != "start":
        return
    _, index, recipe, devices = msg
    entry(conn, parent_pid, index, recipe, devices)
