"""The v2 commit protocol: blobs to temp names, pending marker, blobs in place, manifest last.

1. Blobs are hashed and, as each one's hash is known, written (in parallel chunks)
   to a temp name beside its final one, unless that blob already exists. Hashing
   and writing overlap: the device is busy while later blobs are still hashed. A
   blob whose place in the state held a new blob at the last save, or any blob when
   nothing is stored yet, is written while it is hashed, under an unnamed temp
   file, and named once hashed (dropped if it exists after all).
2. A pending marker (``blobs/pending/<id>.json``) names every blob the checkpoint
   will reference, so a concurrent GC keeps them (see :mod:`.retention`). It is
   not fsynced: it only matters while its writer lives. Blobs found existing in
   step 1 are checked again after it; any gone are written. A state of JSON only
   has no blobs and no marker.
3. The written blobs are fsynced and renamed into place (object stores: one PUT
   each), then their directories are fsynced. The manifest is built and staged
   meanwhile (locally: written to a temp file beside its name and fsynced).
4. The manifest is published with a conditional create (locally: a hard link of
   the staged file), durably.
5. The marker is removed.

A crash before step 4 leaves temp files and blobs no manifest references (GC
removes them) and never a checkpoint. This module must never publish a manifest
before every blob it references is durable.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from .._faults import fault_point
from ..errors import CheckpointError
from .blobs import BLOB_DIR, PENDING_DIR, BlobPlan, hash_blob
from .format import MANIFEST_NAME, ArrayEntry, FileEntry, Manifest, OpaqueEntry
from .jobs import JobGroup
from .storage import BlobWriter, CheckpointStorage, Staged


@dataclass(frozen=True)
class WriteStats:
    """What a save did: bytes written and reused, and how long the background part took."""

    written_bytes: int
    reused_bytes: int
    blobs_written: int
    blobs_reused: int
    seconds: float


def write_blobs(storage: CheckpointStorage, plans: list[BlobPlan], pool: Executor | None) -> None:
    """Write ``plans`` durably and put them in place (hashing any not hashed yet)."""
    writers, _ = _write_temp(storage, plans, pool, reusable=lambda p: False)
    _commit(storage, writers, pool)


@dataclass(eq=False)
class _Blob:
    """A blob being written: its writer, its write jobs not ended, and whether it was
    dropped (written on a guess, then found to exist already: its writes stop)."""

    writer: BlobWriter
    left: int
    dropped: bool = False


_Batches = list[list[tuple[int, memoryview]]]


def _write_temp(
    storage: CheckpointStorage,
    plans: list[BlobPlan],
    pool: Executor | None,
    *,
    reusable: Callable[[BlobPlan], bool],
    then: Callable[[], None] | None = None,
    guess: Callable[[BlobPlan], bool] = lambda p: False,
) -> tuple[list[BlobWriter], list[BlobPlan]]:
    """Hash every plan and write each new blob to a temp name.

    Returns the writers (not committed) and the plans whose blob ``reusable`` found;
    plans with the same bytes are written once. One job hashes the plans, one after
    another (two hashing threads measured slower on two cores: they took CPU from the
    copies into the page cache), and queues each blob's writes:

    - as soon as it is hashed: the blob is created under its name and nothing is
      written that exists already;
    - or, for a plan that ``guess`` says is new (nothing is stored yet, or its place
      in the state held a new blob last time, as a weight that changes at every
      step does), before it is hashed: the blob is written under an unnamed temp
      file while this job hashes it, and named after. A guess that loses (the blob
      exists) skips its remaining writes and is aborted once they have ended: only
      the pieces written while it was hashed went out (each large piece starts for
      the device as it is written). Without the guess, a large blob's whole hash
      (4 ms for 64 MiB here) came before its first byte went out.

    A blob's large pieces start for the device as each is written, and the rest
    (:meth:`.BlobWriter.written`) once its last piece is, while later blobs are
    still hashed and copied. ``then`` runs
    as one more job once every plan is hashed and checked.

    On any failure (a full disk, typically) every writer is aborted, but only
    after every job that uses one has ended (:class:`.jobs.JobGroup`): a writer
    closed under a running ``pwrite`` frees its descriptor number for the next
    ``open`` in the process, and the late write lands in that file.
    """
    lock = threading.Lock()
    blobs: list[_Blob] = []  # every writer started, named or dropped
    seen: set[str] = set()  # the chain runs on one thread at a time: no lock
    reused: list[BlobPlan] = []
    group = JobGroup(pool)

    def write(b: _Blob, batch: list[tuple[int, memoryview]]) -> None:
        if not b.dropped:
            for off, piece in batch:
                b.writer.write_at(off, piece)
        with lock:
            b.left -= 1
            last = not b.left
        if last and not b.dropped:
            b.writer.written()

    def start(w: BlobWriter, batches: _Batches) -> _Blob:
        b = _Blob(w, len(batches))
        with lock:
            blobs.append(b)
        if not batches:
            w.written()
        return b

    def new(p: BlobPlan) -> bool:
        """Whether hashed ``p`` is to be written: not the bytes of an earlier plan,
        and not found (then it is reused)."""
        if p.path in seen:
            return False
        seen.add(p.path)
        if reusable(p):
            reused.append(p)
            return False
        return True

    def prepare(p: BlobPlan) -> tuple[_Blob | None, _Batches]:
        """Hash ``p`` and create its blob if new: the blob and the writes to queue."""
        p.join_segments()
        if not p.key:
            p.key = hash_blob(p)
        if not new(p):
            return None, []
        batches = p.batches()
        return start(storage.create_blob(p.path, p.size), batches), batches

    def next_job(i: int) -> None:
        if i + 1 < len(plans):
            group.submit(chain, i + 1)
        elif then is not None:
            group.submit(then)

    def chain(i: int) -> None:
        p = plans[i]
        if p.key or not guess(p):
            b, batches = prepare(p)
            # The next hash goes in the queue before this blob's writes: queued after
            # them, it waited for a free thread until most of a large blob was copied
            # (measured: the second of two 64 MiB blobs hashed 17 ms late).
            next_job(i)
            for batch in batches:
                group.submit(write, b, batch)
            return
        p.join_segments()
        batches = p.batches()
        b = start(storage.start_blob(BLOB_DIR, p.size), batches)
        for batch in batches:
            group.submit(write, b, batch)
        p.key = hash_blob(p)  # while the pool's other threads write it
        if new(p):
            b.writer.name(p.path)
        else:
            b.dropped = True
        next_job(i)

    try:
        if pool is None or not plans:
            for p in plans:  # inline: a chain would recurse once per plan
                b, batches = prepare(p)
                if b is not None:
                    for batch in batches:
                        write(b, batch)
            if then is not None:
                then()
        else:
            group.submit(chain, 0)
        group.join()
    except BaseException:
        group.settle()  # joined already, unless interrupted while submitting
        _abort([b.writer for b in blobs])
        raise
    _abort([b.writer for b in blobs if b.dropped])  # every job that used them has ended
    return [b.writer for b in blobs if not b.dropped], reused


def _commit(storage: CheckpointStorage, writers: list[BlobWriter], pool: Executor | None) -> None:
    """Make written blobs durable and put them in place; abort them all on failure."""
    try:
        # fsyncs block on the device; running them in parallel lets it merge them.
        storage.commit_blobs(writers, pool, before_publish=lambda: fault_point("checkpoint.blob_tmp"))
    except BaseException:
        _abort(writers)
        raise


def _abort(writers: list[BlobWriter]) -> None:
    """Discard blobs not committed (every job writing them has ended)."""
    for w in writers:
        with contextlib.suppress(OSError):
            w.abort()


def _present(storage: CheckpointStorage, p: BlobPlan, known: set[str] | None) -> bool:
    if known is not None and p.path in known:
        return True
    try:
        # Content-addressed: the right size under the right name is the right bytes,
        # unless it rotted; verification on load catches that.
        return storage.size(p.path) == p.size
    except (FileNotFoundError, NotADirectoryError):
        return False


def write_checkpoint(
    storage: CheckpointStorage,
    path: str,
    plans: list[BlobPlan],
    *,
    tree: Any,
    meta: dict[str, Any],
    versions: dict[str, str],
    tags: tuple[str, ...] = (),
    pool: Executor | None = None,
    known: set[str] | None = None,
    fresh: set[str] | None = None,
) -> tuple[Manifest, WriteStats]:
    """Hash, write and publish a staged checkpoint at ``path`` (see the module docstring).

    ``known`` is a cache of blob paths this process already made durable; it is
    updated with the blobs of this checkpoint. ``fresh``, kept by the caller from
    one save to the next, holds the places in the state (:func:`_place`) whose blob
    the last save wrote new: those are written while they are hashed, as is every
    blob when the storage holds none yet.
    """
    try:
        return _write_checkpoint(storage, path, plans, tree=tree, meta=meta, versions=versions,
                                 tags=tags, pool=pool, known=known, fresh=fresh)
    except OSError as e:
        # A full disk must say which checkpoint it stopped (the worker's one-line error).
        e.segue_checkpoint = path  # type: ignore[attr-defined]
        raise


def _write_checkpoint(
    storage: CheckpointStorage,
    path: str,
    plans: list[BlobPlan],
    *,
    tree: Any,
    meta: dict[str, Any],
    versions: dict[str, str],
    tags: tuple[str, ...],
    pool: Executor | None,
    known: set[str] | None,
    fresh: set[str] | None,
) -> tuple[Manifest, WriteStats]:
    t0 = time.perf_counter()
    manifest_path = f"{path}/{MANIFEST_NAME}"
    marker = f"{PENDING_DIR}/{uuid.uuid4().hex}.json"
    marked = False

    def hashed() -> None:
        """Once every blob is hashed, while the last ones are written: the marker."""
        nonlocal marked
        unique = {p.path: None for p in plans}
        if unique:  # a state of JSON only (a data step's) has no blob to keep
            body = {"path": path, "pid": os.getpid(), "created": time.time(),
                    "blobs": list(unique)}
            # Not fsynced: a marker matters only while this process lives (GC reads it
            # from the page cache), and its fsync would flush the blobs' dirty pages.
            storage.write_bytes_atomic(marker, json.dumps(body).encode(), durable=False)
            marked = True

    def build() -> tuple[Manifest, Staged]:
        m = _manifest(plans, tree=tree, meta=meta, versions=versions, tags=tags)
        # Staged (locally: written to a temp file and fsynced) while the blobs are
        # fsynced: only its link into place waits for them.
        return m, storage.stage(manifest_path, m.to_json().encode())

    try:
        # With nothing stored yet (a job's first save in its directory), no blob can be
        # found: each is written while it is hashed. Asked at most once, only for a blob
        # with no history, never by a process that made blobs durable here already
        # (not at every save of a JSON-only state, nor of a frozen one).
        empty = functools.cache(lambda: not known and _holds_no_blob(storage))

        def guess(p: BlobPlan) -> bool:
            return (fresh is not None and _place(p) in fresh) or empty()

        writers, reused = _write_temp(storage, plans, pool, then=hashed,
                                      reusable=lambda p: _present(storage, p, known), guess=guess)
        try:
            # A GC that ran before the marker may have removed a blob seen in step 1.
            gone = [p for p in reused if not _present(storage, p, None)]
            if gone:
                writers += _write_temp(storage, gone, pool, reusable=lambda p: False)[0]
                reused = [p for p in reused if p not in gone]
        except BaseException:
            _abort(writers)
            raise
        unique = list({p.path: p for p in plans}.values())
        missing = [p for p in unique if p not in reused]
        # The manifest (pure Python, ~14 ms of CPU for 2,000 arrays) is built and staged
        # while the blobs are fsynced, when the CPU waits for the device. Built on the
        # hashing chain, as it was, it ran beside the last blobs' page-cache copies,
        # which on two cores need the CPU; the end-to-end gain is within this VM's
        # noise (README). Staged after the blobs, its write and fsync came last.
        building = JobGroup(pool)
        manifest_job = building.submit(build)
        try:
            _commit(storage, writers, pool)
            fault_point("checkpoint.blob_written")
            manifest, staged = manifest_job.result()
        except BaseException:
            building.settle()  # no job outlives a failed save (jobs.JobGroup)
            _discard(manifest_job)
            raise
        try:
            staged.publish(before_publish=lambda: fault_point("checkpoint.manifest_tmp"))
        except FileExistsError:
            raise CheckpointError(
                f"checkpoint {path} already exists and checkpoints are immutable; "
                "save to a new path"
            ) from None
        fault_point("checkpoint.published")
        # A GC that raced us may have removed a blob we reused after we saw it; we
        # still hold its bytes, so put it back (the marker kept everything else).
        gone = [p for p in reused if not _present(storage, p, None)]
        write_blobs(storage, gone, pool)
    finally:
        if marked:
            with contextlib.suppress(OSError):
                storage.remove(marker)
    if known is not None:
        known.update(p.path for p in unique)
    if fresh is not None:
        fresh.clear()
        fresh.update(_place(p) for p in missing)
    stats = WriteStats(
        written_bytes=sum(p.size for p in missing),
        reused_bytes=sum(p.size for p in reused),
        blobs_written=len(missing),
        blobs_reused=len(reused),
        seconds=time.perf_counter() - t0,
    )
    return manifest, stats


def _discard(job: Future[tuple[Manifest, Staged]]) -> None:
    """Drop the staged manifest of a save that failed (the job has ended)."""
    if job.done() and not job.cancelled() and job.exception() is None:
        with contextlib.suppress(OSError):
            job.result()[1].discard()


def _holds_no_blob(storage: CheckpointStorage) -> bool:
    return all(f"{BLOB_DIR}/{name}" == PENDING_DIR for name in storage.listdir(BLOB_DIR))


def _place(p: BlobPlan) -> str:
    """Where a blob sits in its state: its kind, first reference and size. The same
    place in the next save of the same state holds the same weights."""
    return f"{p.kind}:{next(iter(p.arrays or p.opaque), '')}:{p.size}"


def _manifest(
    plans: list[BlobPlan],
    *,
    tree: Any,
    meta: dict[str, Any],
    versions: dict[str, str],
    tags: tuple[str, ...],
) -> Manifest:
    files: dict[str, FileEntry] = {}
    arrays: dict[str, ArrayEntry] = {}
    opaque: dict[str, OpaqueEntry] = {}
    for p in plans:
        files[p.path] = FileEntry(p.size, p.key)
        for ref, a in p.arrays.items():
            arrays[ref] = replace(a, file=p.path)
        for ref, o in p.opaque.items():
            opaque[ref] = replace(o, file=p.path)
    # Refs in tree order, so the manifest reads like the state.
    arrays = dict(sorted(arrays.items(), key=lambda kv: int(kv[0][1:])))
    return Manifest(
        created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
        meta=meta,
        versions=versions,
        tree=tree,
        arrays=arrays,
        files=files,
        opaque=opaque,
        tags=tags,
    )
