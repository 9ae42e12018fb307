"""Run jobs on a pool and return only once every one of them has ended.

``Executor.map`` is not safe for jobs that use a resource the caller frees next:
when one job fails, iterating its results raises at once and cancels the jobs
not started yet, but the ones already running go on. Their caller then closes
the file descriptors (or recycles the buffer) they still use. A descriptor
number freed that way is handed to the next ``open`` anywhere in the process,
so a late ``pwrite`` lands in an unrelated file: that is how a checkpoint blob's
bytes once overwrote page 1 of the metadata store when a save hit ENOSPC.

:class:`JobGroup` (and :func:`run_all`, a batch of it) skips what has not started
after the first failure, waits for what has, and raises the first failure with the
others attached as notes. Its jobs may add more jobs to the group while they run
(a blob that has been hashed submits its writes), and :meth:`JobGroup.join` waits
for those too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Executor, Future, wait
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class JobGroup:
    """Jobs on ``pool`` (run inline without one) that :meth:`join` waits for, all of them.

    A job may call :meth:`submit` while it runs. After a job fails, jobs that have
    not started are skipped and :meth:`submit` adds nothing more.
    """

    def __init__(self, pool: Executor | None) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._futs: list[Future[Any]] = []
        self._failed = False  # under _lock, so no job is added after join() saw a failure

    def submit(self, fn: Callable[..., R], *args: Any) -> Future[R]:
        """Run ``fn(*args)`` on the pool; without a pool, run it now (its error raises here).

        Once a job has failed this adds nothing and returns a cancelled future."""
        if self._pool is None:
            done: Future[R] = Future()
            done.set_result(fn(*args))
            return done

        def job() -> R:
            if self._failed:  # a sibling failed: do no more work, touch nothing
                raise _Skipped
            try:
                return fn(*args)
            except BaseException:
                self.cancel()
                raise

        with self._lock:
            if self._failed:  # a job failed: add nothing, say so with a cancelled future
                skipped: Future[R] = Future()
                skipped.cancel()
                return skipped
            fut = self._pool.submit(job)
            self._futs.append(fut)
        return fut

    def cancel(self) -> None:
        """Skip every job that has not started and accept no new ones."""
        with self._lock:
            self._failed = True
            futs = list(self._futs)
        for f in futs:
            f.cancel()

    def join(self) -> None:
        """Return once every job (those added while waiting too) has ended; raise the
        first failure, in submission order, with the others as notes."""
        try:
            while not self._failed:
                with self._lock:
                    pending = [f for f in self._futs if not f.done()]
                if not pending:
                    break
                wait(pending, return_when=FIRST_EXCEPTION)
        except BaseException:
            self.settle()  # interrupted here (KeyboardInterrupt): stop, wait, re-raise
            raise
        self.settle()
        errors = [e for f in self._futs if not f.cancelled() and (e := f.exception()) is not None
                  and not isinstance(e, _Skipped)]
        if errors:
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f"a parallel job also failed: {type(other).__name__}: {other}")
            raise first

    def settle(self) -> None:
        """After a failure (or when the caller gives up): cancel what has not started
        and wait, uninterruptibly, for what has. Raises nothing of the jobs'."""
        if self._failed or not all(f.done() for f in self._futs):
            self.cancel()
        _wait_uninterrupted(self._futs)  # complete: nothing is added once cancelled


def run_all(pool: Executor | None, fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``[fn(x) for x in items]``, in parallel on ``pool``; no job outlives the call.

    After a job fails, jobs that have not started are skipped. The first failure
    (in submission order) is raised once every started job has returned.
    """
    if pool is None or len(items) < 2:
        return [fn(x) for x in items]
    group = JobGroup(pool)
    futs: list[Future[R]] = []
    try:
        for x in items:
            futs.append(group.submit(fn, x))
    except BaseException:
        group.settle()  # interrupted while submitting: no job outlives the call
        raise
    group.join()
    return [f.result() for f in futs]


class _Skipped(Exception):
    """A job that did not run because a sibling failed first."""


def _wait_uninterrupted(futs: list[Future[Any]]) -> None:
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
