"""Save, load, verify and quarantine checkpoints: the public synchronous API.

Format v2 (written): data lives in content-addressed blobs under ``blobs/`` at the
storage root, shared between checkpoints; a checkpoint is the directory holding its
``MANIFEST.json``, which lists every blob with its size and hash and is published
last, with a conditional create (:mod:`.writer`). No manifest means no checkpoint,
so a crash at any moment leaves either the complete checkpoint or none.
Checkpoints are immutable: saving over a published one is refused. Format v1
(every file inside the checkpoint directory) is still read (:mod:`.reader`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import platform
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .._faults import fault_point
from ..errors import CheckpointCorruptError, CheckpointError, StateTypeError
from . import blobs as _blobs
from .format import MANIFEST_NAME, FileEntry, Manifest
from .reader import check_hash, check_size, read_arrays, read_opaque, verify_files
from .reader import read_manifest as _read_manifest
from .storage import CheckpointStorage, check_relpath
from .tree import MalformedTreeError, decode, encode
from .writer import WriteStats, write_checkpoint

QUARANTINE_DIR = "quarantine"
DEFAULT_WORKERS = 4
"""Threads for parallel copy, hash, write and read: I/O bound, so more than the cores."""


@dataclass(frozen=True)
class SaveResult:
    path: str
    nbytes: int
    """Bytes of every file the checkpoint references (shared blobs included)."""
    files: dict[str, FileEntry]
    manifest: Manifest
    stats: WriteStats | None = None
    """What this save wrote and reused (v2): ``stats.written_bytes`` <= ``nbytes``."""


@dataclass(frozen=True)
class LoadResult:
    state: Any
    manifest: Manifest


def _norm(path: str) -> str:
    p = check_relpath(path).as_posix()
    if p in ("", "."):
        raise ValueError("checkpoint path is empty; pass a directory below the storage root")
    return p


@functools.cache
def _versions() -> tuple[tuple[str, str], ...]:
    import importlib.metadata  # 60 ms to import: only when the first manifest is written

    # Read from package metadata, so recording torch's version never imports torch.
    out = {"python": platform.python_version()}
    for dist in ("segue", "numpy", "torch"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if dist == "segue":  # run from a source tree that was never installed
                out[dist] = "unknown"
    return tuple(out.items())


def versions() -> dict[str, str]:
    """Library versions recorded in every manifest (read once per process)."""
    return dict(_versions())


def check_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    try:
        checked: dict[str, Any] = json.loads(json.dumps(dict(meta), allow_nan=False))
        return checked
    except (TypeError, ValueError) as e:
        raise StateTypeError(
            f"checkpoint meta must be plain JSON (str keys, finite numbers) but is not ({e}); "
            "convert it"
        ) from None


@contextlib.contextmanager
def worker_pool(pool: Executor | None, workers: int | None) -> Iterator[Executor | None]:
    """The caller's pool, or a fresh one for this call (None when ``workers`` is 1)."""
    if pool is not None:
        yield pool
        return
    n = DEFAULT_WORKERS if workers is None else workers
    if n <= 1:
        yield None
        return
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="segue-ckpt") as own:
        yield own


def refuse_existing(storage: CheckpointStorage, path: str) -> None:
    if storage.exists(f"{path}/{MANIFEST_NAME}"):
        raise CheckpointError(
            f"checkpoint {path} already exists and checkpoints are immutable; save to a new path"
        )


def save(
    storage: CheckpointStorage,
    path: str,
    state: Any,
    *,
    meta: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
    tags: Sequence[str] = (),
    workers: int | None = None,
    pool: Executor | None = None,
) -> SaveResult:
    """Write ``state`` as an immutable checkpoint ``path``; publish its manifest last.

    Arrays unchanged since any checkpoint in the same storage root are not written
    again. Blocks until the manifest is durable; see :class:`~.Checkpointer` for
    the asynchronous form.
    """
    path = _norm(path)
    fault_point("checkpoint.start")
    refuse_existing(storage, path)
    # Encode before writing anything, so a state that cannot be stored writes nothing.
    enc = encode(state, allow_pickle=allow_pickle)
    meta_json = check_meta(meta or {})
    plans = _blobs.plan(enc)
    with worker_pool(pool, workers) as ex:
        manifest, stats = write_checkpoint(
            storage, path, plans, tree=enc.tree, meta=meta_json, versions=versions(),
            tags=tuple(tags), pool=ex,
        )
    return SaveResult(path, sum(f.size for f in manifest.files.values()), manifest.files,
                      manifest, stats)


def read_manifest(storage: CheckpointStorage, path: str) -> Manifest:
    """Parse the manifest; CheckpointCorruptError if it is missing or unreadable."""
    return _read_manifest(storage, _norm(path))


def verify(
    storage: CheckpointStorage, path: str, *, workers: int | None = None
) -> Manifest:
    """Check the manifest and every file's size and hash; return the manifest."""
    path = _norm(path)
    manifest = _read_manifest(storage, path)
    with worker_pool(None, workers) as ex:
        verify_files(storage, path, manifest, ex)
    return manifest


def load(
    storage: CheckpointStorage,
    path: str,
    *,
    allow_pickle: bool = False,
    verify: bool = True,
    workers: int | None = None,
) -> LoadResult:
    """Read and (by default) verify a checkpoint, then rebuild its state."""
    path = _norm(path)
    manifest = _read_manifest(storage, path)
    covered = {a.file for a in manifest.arrays.values()} | {o.file for o in manifest.opaque.values()}
    if verify:  # files the readers below do not cover
        for name in manifest.files.keys() - covered:
            check_size(storage, path, manifest, name)
            check_hash(storage, path, manifest, name)
    with worker_pool(None, workers) as ex:
        arrays = read_arrays(storage, path, manifest, verify, ex)
    opaque = read_opaque(storage, path, manifest, verify)
    meta = {ref: a.meta for ref, a in manifest.arrays.items()}
    try:
        state = decode(manifest.tree, arrays, meta, opaque, allow_pickle=allow_pickle)
    except MalformedTreeError as e:
        raise CheckpointCorruptError(path, f"tree: {e}") from None
    return LoadResult(state, manifest)


def quarantine(storage: CheckpointStorage, path: str, reason: str) -> str:
    """Move a bad checkpoint aside to ``quarantine/`` with a REASON.txt; return its new path."""
    path = _norm(path)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    base = f"{QUARANTINE_DIR}/{path.replace('/', '__')}-{stamp}"
    dst, n = base, 1
    while storage.exists(dst):
        dst, n = f"{base}-{n}", n + 1
    manifest = None
    with contextlib.suppress(CheckpointCorruptError, CheckpointError):
        manifest = _read_manifest(storage, path)
    storage.move(path, dst)
    storage.write_bytes_atomic(f"{dst}/REASON.txt", f"{path}: {reason}\n".encode())
    if manifest is not None and manifest.version >= 2:
        _quarantine_bad_blobs(storage, path, manifest, dst)
    return dst


def _quarantine_bad_blobs(storage: CheckpointStorage, path: str, m: Manifest, dst: str) -> None:
    # Shared blobs stay for the checkpoints that use them, except corrupt ones: those
    # are moved aside too, so the next save that needs the same bytes rewrites them
    # instead of reusing a rotten copy.
    for name in m.files:
        try:
            check_size(storage, path, m, name)
            check_hash(storage, path, m, name)
        except CheckpointCorruptError as e:
            if e.detail.endswith(": missing"):
                continue
            with contextlib.suppress(FileNotFoundError):
                storage.move(name, f"{dst}/blobs/{name.rsplit('/', 1)[-1]}")


def latest_valid(
    storage: CheckpointStorage,
    candidates: Sequence[str],
    *,
    on_bad: Callable[[str, CheckpointCorruptError], None] | None = None,
) -> str | None:
    """The first of ``candidates`` (newest first) that verifies, or None.

    Each one that fails is reported to ``on_bad`` (to quarantine or log it). A
    checkpoint from a newer segue raises CheckpointError rather than being skipped:
    older state must not silently win over state this version cannot read.
    """
    for path in candidates:
        try:
            verify(storage, path)
        except CheckpointCorruptError as e:
            if on_bad is not None:
                on_bad(path, e)
            continue
        return path
    return None


def list_dir_checkpoints(storage: CheckpointStorage, prefix: str) -> list[str]:
    """Paths of the subdirectories of ``prefix`` that hold a manifest, sorted by name."""
    base = check_relpath(prefix).as_posix()
    base = "" if base == "." else base
    out = []
    for name in storage.listdir(base):
        sub = f"{base}/{name}" if base else name
        if storage.exists(f"{sub}/{MANIFEST_NAME}"):
            out.append(sub)
    return out
