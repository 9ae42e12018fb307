"""Asynchronous saves: block only while the state is copied, write in the background.

:meth:`Checkpointer.save_async` encodes the tree, copies every array into a reused
host buffer (one per in-flight slot) and returns; one background thread then
hashes, writes and publishes, in submission order. At most ``max_in_flight`` saves
are staged or writing at once; the next one waits for a slot (backpressure).

A checkpoint is reported (``on_durable``, the handle's result) only after its
manifest is durable. A background failure goes to ``on_error`` at once and is
re-raised by the next call on the checkpointer. This module must never let the
caller's arrays be read after ``save_async`` returns.
"""

from __future__ import annotations

import enum
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._faults import fault_point
from ..errors import CheckpointError
from . import blobs as _blobs
from .io import DEFAULT_WORKERS, SaveResult, _norm, check_meta, refuse_existing, versions
from .storage import CheckpointStorage
from .tree import Encoded, encode
from .writer import write_checkpoint


class CheckpointerState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


_TRANSITIONS = {CheckpointerState.OPEN: {CheckpointerState.CLOSED}, CheckpointerState.CLOSED: set()}


@dataclass(frozen=True)
class SaveCost:
    """What one save cost: the caller's blocked time and the background time."""

    path: str
    blocking_s: float
    background_s: float
    written_bytes: int
    nbytes: int

    @property
    def total_s(self) -> float:
        return self.blocking_s + self.background_s


class Checkpointer:
    """Saves checkpoints into ``storage`` asynchronously; see the module docstring."""

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        max_in_flight: int = 1,
        workers: int | None = None,
        allow_pickle: bool = False,
        on_error: Callable[[str, BaseException], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight}")
        self.storage = storage
        self.allow_pickle = allow_pickle
        self.on_error = on_error
        self._state = CheckpointerState.OPEN
        self._arenas: queue.Queue[_blobs.Arena] = queue.Queue()
        for _ in range(max_in_flight):
            self._arenas.put(_blobs.Arena())
        n = DEFAULT_WORKERS if workers is None else max(1, workers)
        self._copy_pool = ThreadPoolExecutor(max(1, os.cpu_count() or 1), "segue-ckpt-copy")
        self._io_pool = ThreadPoolExecutor(n, "segue-ckpt-io")
        self._background = ThreadPoolExecutor(1, "segue-ckpt-bg")  # one at a time, in order
        self._pending: list[Future[SaveResult]] = []
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._known: set[str] = set()
        self._fresh: set[str] = set()  # where the last save wrote new blobs (writer.write_checkpoint)
        self.last_cost: SaveCost | None = None

    # -- lifecycle -------------------------------------------------------------
    @property
    def state(self) -> CheckpointerState:
        return self._state

    def _transition(self, to: CheckpointerState) -> None:
        if to not in _TRANSITIONS[self._state]:
            raise CheckpointError(
                f"checkpointer cannot go from {self._state.value} to {to.value}; "
                "make a new Checkpointer"
            )
        self._state = to

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _raise_pending_error(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def _check_open(self) -> None:
        if self._state is not CheckpointerState.OPEN:
            raise CheckpointError("checkpointer is closed; make a new Checkpointer to save")

    # -- saving ----------------------------------------------------------------
    def save_async(
        self,
        path: str,
        state: Any,
        *,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        on_durable: Callable[[SaveResult], None] | None = None,
        blobs: Sequence[_blobs.BlobPlan] = (),
    ) -> Future[SaveResult]:
        """Stage ``state`` and write it in the background; the future resolves when durable.

        Raises the failure of an earlier background save, if any, before starting.
        Blocks while ``max_in_flight`` saves are already staged or writing.

        ``blobs``: more blobs of this checkpoint, hashed already and not staged (their
        bytes are the caller's copies, which must not change until the future is done:
        a scratch directory's snapshot, :mod:`.scratch`); listed in the manifest's files.
        """
        self._check_open()
        self._raise_pending_error()
        path, enc, meta_json, plans = self._plan(path, state, meta)
        arena = self._arenas.get()  # backpressure: wait for a free slot
        t0 = time.perf_counter()
        try:
            staged = _blobs.stage(plans, arena, self._copy_pool) + list(blobs)
            fault_point("checkpoint.staged")
        except BaseException:
            self._arenas.put(arena)
            raise
        blocking_s = time.perf_counter() - t0
        tree = enc.tree  # JSON only: the tree holds references, never array data
        del plans, enc  # the background must only see our own copies
        fut = self._background.submit(
            self._write, path, staged, arena, tree_meta=(meta_json, tuple(tags)),
            tree=tree, blocking_s=blocking_s, on_durable=on_durable,
        )
        with self._lock:
            self._pending = [f for f in self._pending if not f.done()] + [fut]
        return fut

    def save(
        self,
        path: str,
        state: Any,
        *,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        on_durable: Callable[[SaveResult], None] | None = None,
        blobs: Sequence[_blobs.BlobPlan] = (),
    ) -> SaveResult:
        """Save and return once the manifest is durable (and ``on_durable`` has run).

        The caller waits anyway, so nothing is staged: the arrays are hashed and
        written from where they are, and must not change until this returns. Every
        save submitted earlier is durable first (its failure raises here), so saves
        still become durable in order. A failure raises here, not at the next call.
        """
        self.wait()
        self._check_open()
        path, enc, meta_json, plans = self._plan(path, state, meta)
        return self._publish(path, plans + list(blobs), meta=meta_json, tags=tuple(tags), tree=enc.tree,
                             on_durable=on_durable, blocked_since=time.perf_counter())

    def _plan(self, path: str, state: Any, meta: Mapping[str, Any] | None
              ) -> tuple[str, Encoded, dict[str, Any], list[_blobs.BlobPlan]]:
        """Check and encode a save before any byte is written (a state that cannot be
        stored writes nothing): its path, encoding, meta and blob plans."""
        path = _norm(path)
        fault_point("checkpoint.start")
        refuse_existing(self.storage, path)
        enc = encode(state, allow_pickle=self.allow_pickle)
        return path, enc, check_meta(meta or {}), _blobs.plan(enc)

    def _publish(
        self,
        path: str,
        plans: list[_blobs.BlobPlan],
        *,
        meta: dict[str, Any],
        tags: tuple[str, ...],
        tree: Any,
        on_durable: Callable[[SaveResult], None] | None,
        blocking_s: float = 0.0,
        blocked_since: float | None = None,
    ) -> SaveResult:
        """Write ``plans`` as checkpoint ``path``, record its cost, run ``on_durable``.

        ``blocked_since``: the caller waits for this write (:meth:`save`), so all of it
        is blocking time."""
        manifest, stats = write_checkpoint(
            self.storage, path, plans, tree=tree, meta=meta, versions=versions(),
            tags=tags, pool=self._io_pool, known=self._known, fresh=self._fresh,
        )
        result = SaveResult(
            path, sum(f.size for f in manifest.files.values()), manifest.files, manifest, stats
        )
        if blocked_since is None:
            self.last_cost = SaveCost(path, blocking_s, stats.seconds, stats.written_bytes,
                                      result.nbytes)
        else:
            self.last_cost = SaveCost(path, time.perf_counter() - blocked_since, 0.0,
                                      stats.written_bytes, result.nbytes)
        if on_durable is not None:
            on_durable(result)
        return result

    def _write(
        self,
        path: str,
        staged: list[_blobs.BlobPlan],
        arena: _blobs.Arena,
        *,
        tree_meta: tuple[dict[str, Any], tuple[str, ...]],
        tree: Any,
        blocking_s: float,
        on_durable: Callable[[SaveResult], None] | None,
    ) -> SaveResult:
        meta, tags = tree_meta
        try:
            return self._publish(path, staged, meta=meta, tags=tags, tree=tree,
                                 on_durable=on_durable, blocking_s=blocking_s)
        except BaseException as e:
            with self._lock:
                self._error = e
            if self.on_error is not None:
                try:
                    self.on_error(path, e)
                except Exception:  # noqa: S110 - the original failure is what matters
                    pass
            raise
        finally:
            self._arenas.put(arena)

    def wait(self) -> None:
        """Block until every save submitted so far is durable; raise a failure if any."""
        with self._lock:
            pending = list(self._pending)
        for f in pending:
            f.exception()  # waits; errors are raised below, once
        self._raise_pending_error()

    def close(self) -> None:
        """Drain, then release the threads; raises a pending failure after closing."""
        if self._state is CheckpointerState.CLOSED:
            return
        try:
            self.wait()
        finally:
            self._transition(CheckpointerState.CLOSED)
            self._background.shutdown(wait=True)
            self._io_pool.shutdown(wait=True)
            self._copy_pool.shutdown(wait=True)

