"""A directory of files saved with a checkpoint, and put back from one (``ctx.scratch``).

:func:`snapshot` copies every regular file of a directory, a small one (below
:data:`SMALL_BYTES`) into memory and a larger one into a snapshot directory beside it
(same filesystem: the kernel's copy, a reflink where the filesystem has them, then
mapped), hashes each copy, and returns one content-addressed blob plan per file
(:class:`.blobs.BlobPlan` of kind ``file``, its bytes the copy) and the listing that
goes in the checkpoint's manifest ``meta["scratch"]``. The caller hands
the plans to the checkpoint's save (:meth:`.Checkpointer.save_async` ``blobs=``): they
are written like any blob (a file unchanged since an earlier checkpoint has a blob of
that name already and is not written again), listed with size and hash in the
manifest's ``files`` (so :func:`.io.load` verifies them, and GC keeps them), and the
manifest is still published last. The copy is taken when the checkpoint is called:
the step may write to its files again as soon as the call returns.

:func:`restore` makes a directory hold exactly the files a checkpoint's listing names,
each checked against its hash while it is copied out of storage.

This module knows nothing of runs, steps or epochs: the caller names the directory,
the limit and the fix for a directory over it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import xxhash

from .._lazy import numpy_on_first_use
from ..errors import CheckpointCorruptError, CheckpointError
from ..units import format_bytes
from .blobs import BlobPlan
from .format import Manifest
from .safetensors_io import CHUNK
from .storage import CheckpointStorage

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy_on_first_use(globals())

META_KEY = "scratch"
"""The key of the listing in a checkpoint manifest's ``meta``."""
SMALL_BYTES = 1 << 20
"""Files below this size are snapshotted in memory, larger ones as a copy on disk."""
FILE_KIND = "file"
"""The kind of a blob plan that holds one scratch file's bytes (stored as ``.bin``)."""


class ScratchTooLargeError(CheckpointError):
    """The directory holds more bytes than its declared size: the checkpoint is not taken.
    A retry would grow it again the same way, so it is not retried."""

    segue_retryable = False


class ScratchFileError(CheckpointError):
    """The directory holds something other than regular files and directories."""

    segue_retryable = False


@dataclass
class Snapshot:
    """Files of a directory copied at one moment: the blobs to save and their listing."""

    where: Path
    listing: dict[str, Any]
    plans: list[BlobPlan] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return int(self.listing["bytes"])

    def discard(self) -> None:
        """Remove the copies (once the save that wrote them has ended, either way)."""
        self.plans = []
        shutil.rmtree(self.where, ignore_errors=True)


def _walk(src: Path, what: str) -> tuple[list[str], list[tuple[str, os.stat_result]]]:
    """Sorted directories and regular files below ``src`` (relative POSIX paths)."""
    dirs: list[str] = []
    files: list[tuple[str, os.stat_result]] = []
    for top, subdirs, names in os.walk(src, followlinks=False):
        subdirs.sort()
        rel_top = Path(top).relative_to(src)
        for name in sorted(subdirs + names):
            p = Path(top) / name
            rel = (rel_top / name).as_posix()
            st = p.lstat()
            if stat.S_ISDIR(st.st_mode):
                dirs.append(rel)
            elif stat.S_ISREG(st.st_mode):
                files.append((rel, st))
            else:
                kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "a special file"
                raise ScratchFileError(
                    f"{what} holds {kind}, {rel!r}, and only regular files and directories are "
                    f"saved with a checkpoint; copy the file in instead, or remove it before the checkpoint")
    return dirs, files


def snapshot(src: Path, where: Path, *, limit: int, what: str = "the scratch directory",
             fix: str = "delete files from it before the checkpoint, or declare a larger size") -> Snapshot:
    """Copy the files of ``src`` into ``where`` (created; must not exist) and plan their blobs.

    Refused with :class:`ScratchTooLargeError` (nothing copied) when the files hold more
    than ``limit`` bytes. On any failure ``where`` is removed again.
    """
    dirs, files = _walk(src, what)
    found = sum(st.st_size for _, st in files)
    _check_limit(found, len(files), limit, what, fix)
    where.mkdir(parents=True)
    snap = Snapshot(where, {})
    try:
        listed: dict[str, dict[str, Any]] = {}
        total = 0
        for i, (rel, st) in enumerate(files):
            try:
                data = _copy(src / rel, where / str(i), st.st_size)
            except FileNotFoundError:
                continue  # removed since the walk (by a thread of the step): not there now
            size = int(data.nbytes)
            total += size
            _check_limit(total, len(files), limit, what, fix)  # grown since the walk
            key = xxhash.xxh3_128(memoryview(data)).hexdigest()  # type: ignore[arg-type]
            plan = BlobPlan(FILE_KIND, b"", [data], key=key)
            snap.plans.append(plan)
            listed[rel] = {"blob": plan.path, "size": size, "xxh3_128": key,
                           "mode": stat.S_IMODE(st.st_mode), "mtime_ns": st.st_mtime_ns}
        snap.listing = {"bytes": total, "files": listed, "dirs": dirs}
    except BaseException:
        snap.discard()
        raise
    return snap


def _check_limit(found: int, n: int, limit: int, what: str, fix: str) -> None:
    if found > limit:
        raise ScratchTooLargeError(
            f"{what} holds {format_bytes(found)} ({found} bytes in {n} files) at the checkpoint, "
            f"over its limit of {format_bytes(limit)} ({limit} bytes); {fix}")


def _copy(src: Path, copy: Path, size: int) -> np.ndarray:
    """The bytes of ``src`` now: a small file read into memory (a directory of many small
    files must not take a memory map each: the kernel allows ~65,000), a large one copied
    to ``copy`` (the kernel's copy, a reflink where the filesystem has them) and mapped."""
    if size < SMALL_BYTES:
        with open(src, "rb") as f:
            data = f.read()  # whole, even if it grew since the walk
        if len(data) < SMALL_BYTES:
            return np.frombuffer(data, dtype=np.uint8)
    shutil.copyfile(src, copy)
    n = copy.stat().st_size
    if n == 0:
        return np.zeros(0, dtype=np.uint8)  # an empty file cannot be mapped
    return np.memmap(copy, dtype=np.uint8, mode="r", shape=(n,))


def listing(manifest: Manifest) -> dict[str, Any] | None:
    """The scratch listing a checkpoint holds, or None if it was saved without one."""
    got = manifest.meta.get(META_KEY)
    return got if isinstance(got, dict) else None


def _safe(rel: Any, path: str) -> str:
    p = PurePosixPath(str(rel))
    if not isinstance(rel, str) or not rel or p.is_absolute() or ".." in p.parts or "." in p.parts:
        raise CheckpointCorruptError(path, f"scratch: unsafe path {rel!r}")
    return p.as_posix()


def restore(storage: CheckpointStorage, path: str, manifest: Manifest, dst: Path) -> int:
    """Make ``dst`` (an existing directory) hold exactly the files checkpoint ``path``'s
    listing names; returns how many bytes were copied. Each file is hashed while copied;
    a blob that is missing, not in the manifest, or of other bytes raises
    :class:`~segue.errors.CheckpointCorruptError` (``dst`` then holds no file)."""
    clear(dst)
    found = listing(manifest)
    if found is None:
        return 0
    total = 0
    try:
        for rel in found.get("dirs", []):
            (dst / _safe(rel, path)).mkdir(parents=True, exist_ok=True)
        for rel, f in found.get("files", {}).items():
            target = dst / _safe(rel, path)
            blob = f.get("blob")
            entry = manifest.files.get(blob) if isinstance(blob, str) else None
            if entry is None or entry.size != f.get("size") or entry.xxh3_128 != f.get("xxh3_128"):
                raise CheckpointCorruptError(path, f"scratch: file {rel!r} names blob {blob!r}, "
                                                   "which the manifest does not list as such")
            target.parent.mkdir(parents=True, exist_ok=True)
            total += _copy_out(storage, path, blob, entry.size, entry.xxh3_128, target, rel)
            os.chmod(target, int(f.get("mode", 0o644)) & 0o7777)
            if isinstance(f.get("mtime_ns"), int):
                os.utime(target, ns=(f["mtime_ns"], f["mtime_ns"]))
    except BaseException:
        clear(dst)
        raise
    return total


def _copy_out(storage: CheckpointStorage, path: str, blob: str, size: int, key: str,
              target: Path, rel: str) -> int:
    hasher = xxhash.xxh3_128()
    n = 0
    try:
        with storage.open_read(blob) as src, open(target, "wb") as out:
            while chunk := src.read(CHUNK):
                hasher.update(chunk)
                out.write(chunk)
                n += len(chunk)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(path, f"scratch: blob {blob} of file {rel!r}: missing") from None
    if n != size or hasher.hexdigest() != key:
        raise CheckpointCorruptError(path, f"blob {blob}: checksum mismatch (scratch file {rel!r})")
    return n


def clear(d: Path) -> None:
    """Empty directory ``d`` (created if missing)."""
    if d.exists():
        for p in d.iterdir():
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    d.mkdir(parents=True, exist_ok=True)
