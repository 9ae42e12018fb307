"""Run a batch of jobs on a pool and return only once every one of them has ended.

``Executor.map`` is not safe for jobs that use a resource the caller frees next:
when one job fails, iterating its results raises at once and cancels the jobs
not started yet, but the ones already running go on. Their caller then closes
the file descriptors (or recycles the buffer) they still use. A descriptor
number freed that way is handed to the next ``open`` anywhere in the process,
so a late ``pwrite`` lands in an unrelated file: that is how a checkpoint blob's
bytes once overwrote page 1 of the metadata store when a save hit ENOSPC.

:func:`run_all` cancels what has not started after the first failure, waits for
what has, and raises the first failure with the others attached as notes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def run_all(pool: Executor | None, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, in parallel on ``pool``; no job outlives the call.

    After a job fails, jobs that have not started are skipped. The first failure
    (in submission order) is raised once every started job has returned.
    """
    if pool is None or len(items) < 2:
        return [fn(x) for x in items]
    failed = threading.Event()

    def job(x: T) -> R:
        if failed.is_set():  # a sibling failed: do no more work, touch nothing
            raise _Skipped
        try:
            return fn(x)
        except BaseException:
            failed.set()
            raise

    futs: list[Future[R]] = []
    try:
        for x in items:
            futs.append(pool.submit(job, x))
        wait(futs, return_when=FIRST_EXCEPTION)
    finally:
        if failed.is_set() or len(futs) < len(items) or not all(f.done() for f in futs):
            failed.set()  # interrupted here (KeyboardInterrupt) or a job failed
            for f in futs:
                f.cancel()
        _wait_uninterrupted(futs)
    errors = [e for f in futs if not f.cancelled() and (e := f.exception()) is not None
              and not isinstance(e, _Skipped)]
    if errors:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"a parallel job also failed: {type(other).__name__}: {other}")
        raise first
    return [f.result() for f in futs]


class _Skipped(Exception):
    """A job that did not run because a sibling failed first."""


def _wait_uninterrupted(futs: list[Future[R]]) -> None:
    # Returning while a job still runs is the bug this module exists to prevent,
    # so a second KeyboardInterrupt is held until the jobs have ended.
    pending: BaseException | None = None
    while True:
        try:
            wait(futs)
            break
        except BaseException as e:  # noqa: B036 - re-raised below, after the wait
            pending = e
    if pending is not None:
        raise pending
