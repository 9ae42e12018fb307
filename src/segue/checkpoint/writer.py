"""The v2 commit protocol: pending marker, missing blobs, then the manifest, last.

1. A pending marker (``blobs/pending/<id>.json``) names every blob the checkpoint
   will reference, so a concurrent GC keeps them (see :mod:`.retention`).
2. Blobs that do not exist yet are written in parallel chunks to temp names,
   fsynced and renamed (object stores: one PUT each). Existing ones are reused.
3. The manifest is published with a conditional create, durably.
4. The marker is removed.

A crash before step 3 leaves blobs no manifest references (GC removes them) and
never a checkpoint. This module must never publish a manifest before every blob
it references is durable.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from .._faults import fault_point
from ..errors import CheckpointError
from .blobs import PENDING_DIR, BlobPlan, hash_all
from .format import MANIFEST_NAME, ArrayEntry, FileEntry, Manifest, OpaqueEntry
from .jobs import run_all
from .storage import BlobWriter, CheckpointStorage


@dataclass(frozen=True)
class WriteStats:
    """What a save did: bytes written and reused, and how long the background part took."""

    written_bytes: int
    reused_bytes: int
    blobs_written: int
    blobs_reused: int
    seconds: float


def write_blobs(storage: CheckpointStorage, plans: list[BlobPlan], pool: Executor | None) -> None:
    """Write ``plans`` durably: every chunk of every blob in parallel, then commit each.

    On any failure (a full disk, typically) every writer is aborted, but only
    after every job that uses one has ended (:func:`.jobs.run_all`): a writer
    closed under a running ``pwrite`` frees its descriptor number for the next
    ``open`` in the process, and the late write lands in that file.
    """
    writers: dict[str, BlobWriter] = {}
    try:
        for p in plans:  # one by one: in parallel it measured slower here (ext4)
            writers[p.path] = storage.create_blob(p.path, p.size)
        jobs = [(writers[p.path], batch) for p in plans for batch in p.batches()]

        def write(job: tuple[BlobWriter, list[tuple[int, memoryview]]]) -> None:
            w, batch = job
            for off, piece in batch:
                w.write_at(off, piece)

        run_all(pool, write, jobs)
        # fsyncs block on the device; running them in parallel lets it merge them.
        storage.commit_blobs(list(writers.values()), pool,
                             before_publish=lambda: fault_point("checkpoint.blob_tmp"))
    except BaseException:
        for w in writers.values():
            with contextlib.suppress(OSError):
                w.abort()
        raise


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
) -> tuple[Manifest, WriteStats]:
    """Hash, write and publish a staged checkpoint at ``path`` (see the module docstring).

    ``known`` is a cache of blob paths this process already made durable; it is
    updated with the blobs of this checkpoint.
    """
    try:
        return _write_checkpoint(storage, path, plans, tree=tree, meta=meta, versions=versions,
                                 tags=tags, pool=pool, known=known)
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
) -> tuple[Manifest, WriteStats]:
    t0 = time.perf_counter()
    manifest_path = f"{path}/{MANIFEST_NAME}"
    hash_all(plans, pool)
    unique = list({p.path: p for p in plans}.values())
    marker = f"{PENDING_DIR}/{uuid.uuid4().hex}.json"
    body = {"path": path, "pid": os.getpid(), "created": time.time(),
            "blobs": [p.path for p in unique]}
    storage.write_bytes_atomic(marker, json.dumps(body).encode())
    try:
        reused = [p for p in unique if _present(storage, p, known)]
        missing = [p for p in unique if p not in reused]
        # The manifest (pure Python) is built while the pool's other threads write.
        built = _submit(pool, lambda: _manifest(plans, tree=tree, meta=meta, versions=versions,
                                                tags=tags))
        write_blobs(storage, missing, pool)
        fault_point("checkpoint.blob_written")
        manifest, manifest_json = built.result()
        try:
            storage.publish(
                manifest_path,
                manifest_json,
                before_publish=lambda: fault_point("checkpoint.manifest_tmp"),
            )
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
        with contextlib.suppress(OSError):
            storage.remove(marker)
    if known is not None:
        known.update(p.path for p in unique)
    stats = WriteStats(
        written_bytes=sum(p.size for p in missing),
        reused_bytes=sum(p.size for p in reused),
        blobs_written=len(missing),
        blobs_reused=len(reused),
        seconds=time.perf_counter() - t0,
    )
    return manifest, stats


def _submit(pool: Executor | None, fn: Callable[[], Manifest]) -> Future[tuple[Manifest, bytes]]:
    """``fn``'s manifest and its JSON, built on ``pool`` (or here, without one)."""
    def build() -> tuple[Manifest, bytes]:
        m = fn()
        return m, m.to_json().encode()

    if pool is not None:
        return pool.submit(build)
    done: Future[tuple[Manifest, bytes]] = Future()
    done.set_result(build())
    return done


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
