"""Where checkpoint bytes live: the storage interface and its local-directory backend.

:class:`CheckpointStorage` is the seam the checkpoint format is written against, so
an fsspec/S3 backend can follow. Paths are relative POSIX paths under the storage
root; a backend must never read or write outside its root.

:class:`LocalStorage` makes every write atomic and durable: bytes go to a temp name
in the same directory, are fsynced, ``os.replace``d into place, and the directory is
fsynced. A reader therefore sees either the old file, or the whole new one, never a
torn one, even after power loss.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO, cast

from .._atomic import fsync_dir, start_writeback
from .._faults import fault_point
from .jobs import run_all

TEMP_MARK = ".tmp-"
"""Temp files are named ``.<name>.tmp-<pid>-<random>``; nothing ever reads them."""
WRITEBACK_BYTES = 1 << 20
"""A written piece at least this big starts for the device at once (the blob's
smaller pieces, its header, go with the rest at :meth:`BlobWriter.written`)."""
_DIR_SHARES = 4
"""A save's changed directories are fsynced by at most this many jobs, a share each."""


def check_relpath(relpath: str) -> PurePosixPath:
    """Parse a storage path; reject anything that could escape the storage root."""
    if not isinstance(relpath, str):
        raise TypeError(f"storage paths are str, not {type(relpath).__name__}")
    p = PurePosixPath(relpath)
    if p.is_absolute() or relpath.startswith("\\") or (len(relpath) > 1 and relpath[1] == ":"):
        raise ValueError(
            f"storage path {relpath!r} is absolute; pass a path relative to the storage root"
        )
    if ".." in p.parts or "\\" in relpath:
        raise ValueError(
            f"storage path {relpath!r} leaves the storage root; "
            "pass a relative path without '..' or backslashes"
        )
    return p


@dataclass(frozen=True)
class FileInfo:
    """One stored file, as :meth:`CheckpointStorage.walk` reports it."""

    path: str
    size: int
    mtime: float
    """Seconds since the epoch of the last write (GC's grace period is measured from it)."""


class BlobWriter(ABC):
    """A file of known size being written, possibly from several threads at once.

    Nothing is visible at the path until :meth:`commit`; :meth:`abort` discards it.
    """

    @abstractmethod
    def write_at(self, offset: int, data: memoryview | bytes) -> None:
        """Write ``data`` at ``offset``; safe to call from several threads."""

    @abstractmethod
    def commit(self, before_publish: Callable[[], None] | None = None) -> None:
        """Make the bytes durable, then visible at the path."""

    def written(self) -> None:  # noqa: B027 - optional: most writers have nothing to start
        """Every byte has been written: start making them durable, if that can start
        before the commit (a local file's fsync can). Commit still finishes the job."""

    @abstractmethod
    def name(self, relpath: str) -> None:
        """Give a blob of :meth:`CheckpointStorage.start_blob` its path, before the commit
        (a content-addressed blob's name is known once its bytes are hashed)."""

    @abstractmethod
    def abort(self) -> None: ...


class Staged:
    """A file of :meth:`CheckpointStorage.stage`: made ready now, published later.

    This base version does nothing ahead: :meth:`publish` is a plain
    :meth:`CheckpointStorage.publish` (an object store's conditional PUT)."""

    def __init__(self, storage: CheckpointStorage, relpath: str, data: bytes) -> None:
        self._storage, self.relpath, self._data = storage, relpath, data

    def publish(self, before_publish: Callable[[], None] | None = None) -> None:
        """Create the file durably, only if it does not exist (FileExistsError otherwise)."""
        self._storage.publish(self.relpath, self._data, before_publish=before_publish)

    def discard(self) -> None:  # noqa: B027 - nothing was written ahead
        """Drop what was made ready, unpublished (idempotent; after publish, a no-op)."""


class _BufferedBlobWriter(BlobWriter):
    """Collects the parts and publishes them with one atomic write (object stores)."""

    def __init__(self, storage: CheckpointStorage, relpath: str | None, size: int) -> None:
        self.storage, self.relpath, self.size = storage, relpath, size
        self.parts: list[tuple[int, bytes | memoryview]] = []

    def write_at(self, offset: int, data: memoryview | bytes) -> None:
        self.parts.append((offset, data))  # list.append is atomic under the GIL

    def name(self, relpath: str) -> None:
        self.relpath = relpath

    def commit(self, before_publish: Callable[[], None] | None = None) -> None:
        if self.relpath is None:
            raise ValueError("a blob from start_blob must be named before its commit")
        self.parts.sort(key=lambda p: p[0])
        data = b"".join(p for _, p in self.parts)
        if len(data) != self.size:
            raise ValueError(f"blob {self.relpath}: wrote {len(data)} of {self.size} bytes")
        self.storage.write_bytes_atomic(self.relpath, data, before_publish=before_publish)
        self.parts = []

    def abort(self) -> None:
        self.parts = []


class CheckpointStorage(ABC):
    """Byte storage for checkpoints, addressed by relative POSIX paths."""

    @abstractmethod
    def open_write(
        self, relpath: str, *, before_publish: Callable[[], None] | None = None,
        durable: bool = True,
    ) -> AbstractContextManager[BinaryIO]:
        """A writable file that appears at ``relpath`` atomically and durably on exit.

        On an exception nothing appears. ``before_publish`` runs once the bytes are
        durable but not yet visible (a seam for fault injection). ``durable=False``
        skips the fsyncs: the file still appears whole or not at all to every reader,
        but a power loss may take it (or leave it empty). It is for files that only
        matter while their writer lives, like a save's pending marker, whose fsync
        would also flush every dirty page of the filesystem's journal transaction.
        """

    def write_bytes_atomic(
        self, relpath: str, data: bytes, *, before_publish: Callable[[], None] | None = None,
        durable: bool = True,
    ) -> None:
        with self.open_write(relpath, before_publish=before_publish, durable=durable) as f:
            f.write(data)

    @abstractmethod
    def open_read(self, relpath: str) -> BinaryIO: ...

    def read_bytes(self, relpath: str) -> bytes:
        with self.open_read(relpath) as f:
            return f.read()

    @abstractmethod
    def size(self, relpath: str) -> int: ...

    @abstractmethod
    def exists(self, relpath: str) -> bool: ...

    @abstractmethod
    def listdir(self, reldir: str) -> list[str]:
        """Sorted entry names under ``reldir``; empty if it does not exist.

        Object stores have no directories, so "missing" and "empty" are the same there;
        every backend answers the same way.
        """

    @abstractmethod
    def move(self, src: str, dst: str) -> None:
        """Durably move a file or directory; ``dst`` must not exist."""

    @abstractmethod
    def remove_tree(self, reldir: str) -> None:
        """Remove a directory and everything under it (missing is not an error)."""

    def local_path(self, relpath: str) -> Path | None:
        """A local filesystem path for ``relpath``, or None for remote backends."""
        return None

    # -- used by format v2 (content-addressed blobs) --------------------------
    def create_blob(self, relpath: str, size: int) -> BlobWriter:
        """A writer for a new file of ``size`` bytes at ``relpath`` (see :class:`BlobWriter`)."""
        return _BufferedBlobWriter(self, relpath, size)

    def start_blob(self, reldir: str, size: int) -> BlobWriter:
        """A writer for a new file of ``size`` bytes whose path is not known yet: a temp
        file under ``reldir`` until :meth:`BlobWriter.name` gives it one."""
        return _BufferedBlobWriter(self, None, size)

    def commit_blobs(
        self,
        writers: Sequence[BlobWriter],
        pool: Executor | None,
        before_publish: Callable[[], None] | None = None,
    ) -> None:
        """Commit every writer of :meth:`create_blob` (durable, then visible), in parallel
        on ``pool``; raise the first failure once every started commit has ended."""
        run_all(pool, lambda w: w.commit(before_publish=before_publish), list(writers))

    def stage(self, relpath: str, data: bytes) -> Staged:
        """Make ``data`` ready to be published at ``relpath``, as far as can be done
        before it may be visible; :meth:`Staged.publish` finishes, :meth:`Staged.discard`
        drops it. A checkpoint's manifest is staged while its blobs are made durable."""
        return Staged(self, relpath, data)

    def publish(
        self, relpath: str, data: bytes, *, before_publish: Callable[[], None] | None = None
    ) -> None:
        """Create ``relpath`` durably, only if it does not exist (FileExistsError otherwise).

        The commit marker of a checkpoint is published this way, so two writers of
        the same checkpoint cannot both believe they committed it. The base version
        checks, then writes: backends with a conditional create override it.
        """
        if self.exists(relpath):
            raise FileExistsError(f"{relpath} already exists")
        self.write_bytes_atomic(relpath, data, before_publish=before_publish)

    @abstractmethod
    def walk(self, reldir: str) -> list[FileInfo]:
        """Every file below ``reldir`` (recursively), sorted by path; empty if none."""

    @abstractmethod
    def remove(self, relpath: str) -> None:
        """Remove one file (missing is not an error)."""

    def drop_cache(self, relpath: str) -> None:  # noqa: B027 - optional hook
        """Evict ``relpath`` from the local page cache, if that means anything here."""


class LocalStorage(CheckpointStorage):
    """Checkpoint storage in a local directory, with atomic and durable writes."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def _abs(self, relpath: str) -> Path:
        return self.root.joinpath(*check_relpath(relpath).parts)

    def _makedirs(self, path: Path, *, sync: bool = True) -> list[Path]:
        """Create ``path`` and its missing parents; return the directories whose
        entries changed (each new one's parent). ``sync=False`` leaves their fsync
        to the caller."""
        missing: list[Path] = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for d in reversed(missing):
            with contextlib.suppress(FileExistsError):  # a concurrent writer made it
                d.mkdir()
            # The new directory's entry lives in its parent: fsync the parent so a
            # crash cannot drop the directory that holds files we are about to publish.
            if sync:
                fsync_dir(d.parent)
        return [d.parent for d in missing]

    @contextlib.contextmanager
    def open_write(
        self, relpath: str, *, before_publish: Callable[[], None] | None = None,
        durable: bool = True,
    ) -> Iterator[BinaryIO]:
        final = self._abs(relpath)
        if final == self.root:
            raise ValueError("storage path '' names the root; pass a file path")
        self._makedirs(final.parent, sync=durable)
        # Same directory as the final name, so os.replace is a rename within one
        # filesystem, which POSIX makes atomic.
        tmp = _temp_beside(final)
        f = open(tmp, "xb")  # closed below on every path
        try:
            yield f
            f.flush()
            # The data must be on disk before the rename makes it visible; otherwise a
            # crash could publish a name that points at missing or zeroed blocks.
            if durable:
                os.fsync(f.fileno())
            f.close()
            if before_publish is not None:
                before_publish()
            os.replace(tmp, final)
        except BaseException:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        if durable:  # make the rename itself durable
            fsync_dir(final.parent)

    def open_read(self, relpath: str) -> BinaryIO:
        return open(self._abs(relpath), "rb")

    def size(self, relpath: str) -> int:
        return self._abs(relpath).stat().st_size

    def exists(self, relpath: str) -> bool:
        return self._abs(relpath).exists()

    def listdir(self, reldir: str) -> list[str]:
        try:
            return sorted(os.listdir(self._abs(reldir)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def move(self, src: str, dst: str) -> None:
        s, d = self._abs(src), self._abs(dst)
        if s == self.root or d == self.root:
            raise ValueError("cannot move the storage root; pass paths below it")
        if d.exists():
            raise FileExistsError(f"cannot move {src!r} to {dst!r}: the target exists")
        self._makedirs(d.parent)
        os.rename(s, d)
        # Both directories changed: fsync the target first so that after a crash the
        # entry exists in at least one place.
        fsync_dir(d.parent)
        fsync_dir(s.parent)

    def remove_tree(self, reldir: str) -> None:
        p = self._abs(reldir)
        if p == self.root:
            raise ValueError("cannot remove the storage root; pass a directory below it")
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()
        else:
            return
        fsync_dir(p.parent)

    def local_path(self, relpath: str) -> Path | None:
        return self._abs(relpath)

    def create_blob(self, relpath: str, size: int) -> BlobWriter:
        final = self._abs(relpath)
        # The new directories are fsynced with the blob's own at commit.
        w = _LocalBlobWriter(self, _temp_beside(final), size, self._makedirs(final.parent, sync=False))
        w.name(relpath)
        return w

    def start_blob(self, reldir: str, size: int) -> BlobWriter:
        where = self._abs(reldir)
        new_dirs = self._makedirs(where, sync=False)
        return _LocalBlobWriter(self, where / f".blob{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}",
                                size, new_dirs)

    def commit_blobs(
        self,
        writers: Sequence[BlobWriter],
        pool: Executor | None,
        before_publish: Callable[[], None] | None = None,
    ) -> None:
        # In three batches: every file's data durable (in parallel, so the device
        # merges the flushes), every rename, then each changed directory once. A
        # blob-by-blob commit costs a journal commit per blob and per new directory.
        local = cast(list[_LocalBlobWriter], list(writers))  # create_blob made them all
        run_all(pool, _LocalBlobWriter.sync, local)
        for w in local:
            w.publish(before_publish)
        # A directory's fsync takes less than handing it to a thread: a few threads
        # take a share of them each (measured: 20 new directories, 2.6 -> 2.0 ms).
        dirs = sorted({d for w in local for d in w.dirs})
        run_all(pool, _fsync_dirs, [dirs[k::_DIR_SHARES] for k in range(min(_DIR_SHARES, len(dirs)))])

    def stage(self, relpath: str, data: bytes) -> Staged:
        return _LocalStaged(self, relpath, data)

    def publish(
        self, relpath: str, data: bytes, *, before_publish: Callable[[], None] | None = None
    ) -> None:
        self.stage(relpath, data).publish(before_publish)

    def walk(self, reldir: str) -> list[FileInfo]:
        base = self._abs(reldir)
        out = []
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                p = Path(dirpath, name)
                try:
                    st = p.stat()
                except FileNotFoundError:  # removed while we walked
                    continue
                out.append(FileInfo(p.relative_to(self.root).as_posix(), st.st_size, st.st_mtime))
        return sorted(out, key=lambda i: i.path)

    def remove(self, relpath: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._abs(relpath).unlink()

    def drop_cache(self, relpath: str) -> None:
        fd = os.open(self._abs(relpath), os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class BlobClosedError(ValueError):
    """A write to a blob writer that was already committed or aborted."""


class _OwnedFd:
    """A file descriptor that is closed exactly once, and never while in use.

    A raw int descriptor read by one thread and closed by another is the classic
    wrong-file write: the number is reused by the next ``open`` in the process
    (the metadata store's database or WAL, say) and the late ``pwrite`` lands
    there. Every use goes through :meth:`use`, which counts users under a lock;
    :meth:`close` refuses new users, waits for the current ones, then closes.
    """

    def __init__(self, fd: int, name: str) -> None:
        self._fd: int | None = fd
        self.name = name
        self._users = 0
        self._closing = False
        self._cond = threading.Condition(threading.Lock())

    @contextlib.contextmanager
    def use(self) -> Iterator[int]:
        with self._cond:
            if self._closing or self._fd is None:
                raise BlobClosedError(f"blob {self.name} is closed")
            self._users += 1
            fd = self._fd
        try:
            yield fd  # valid until the last user leaves: close() waits for us
        finally:
            with self._cond:
                self._users -= 1
                if self._users == 0:
                    self._cond.notify_all()

    def close(self) -> None:
        """Close once every current user is done; later calls are no-ops."""
        with self._cond:
            self._closing = True
            while self._users:
                self._cond.wait()
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _fsync_dirs(dirs: Sequence[Path]) -> None:
    for d in dirs:
        fsync_dir(d)


def _temp_beside(final: Path) -> Path:
    return final.with_name(f".{final.name}{TEMP_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")


class _LocalStaged(Staged):
    """A durable temp file beside the final name, hard-linked to it on publish."""

    def __init__(self, storage: LocalStorage, relpath: str, data: bytes) -> None:
        super().__init__(storage, relpath, data)
        self.final = storage._abs(relpath)
        storage._makedirs(self.final.parent)
        self.tmp = _temp_beside(self.final)
        try:
            with open(self.tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            self.discard()
            raise

    def publish(self, before_publish: Callable[[], None] | None = None) -> None:
        try:
            if before_publish is not None:
                before_publish()
            # link(2) fails if the name exists: an atomic create-if-absent, unlike rename.
            os.link(self.tmp, self.final)
        finally:
            self.discard()
        fsync_dir(self.final.parent)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()


class _LocalBlobWriter(BlobWriter):
    """A temp file (beside its final name, or under the directory of
    :meth:`LocalStorage.start_blob` until it is named), written with pwrite from any
    thread, renamed into place on commit."""

    def __init__(self, storage: LocalStorage, tmp: Path, size: int, new_dirs: Sequence[Path] = ()) -> None:
        self._storage, self.tmp, self.size = storage, tmp, size
        self.final: Path | None = None
        self.dirs = set(new_dirs)
        """The directories to fsync once the blob is renamed into place."""
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        # Not preallocated (posix_fallocate): on ext4 (data=ordered) an fallocate
        # waits for the journal, which waits for the earlier blobs' data under
        # writeback; measured here, the second blob's creation then stalled ~30 ms
        # in three saves of eight, and its writes with it. A full disk fails at the
        # first pwrite that does not fit instead (ext4 and XFS reserve at write time),
        # and the save is aborted as cleanly.
        self._fd = _OwnedFd(fd, tmp.name)

    def name(self, relpath: str) -> None:
        final = self._storage._abs(relpath)
        self.dirs |= {final.parent, *self._storage._makedirs(final.parent, sync=False)}
        self.final = final
        self._fd.name = final.name  # what its errors call it

    def write_at(self, offset: int, data: memoryview | bytes) -> None:
        view = memoryview(data).cast("B")
        start, nbytes = offset, len(view)
        with self._fd.use() as fd:
            try:
                fault_point("checkpoint.pwrite")  # tests fill the disk here
                while view:  # pwrite may write less than asked
                    n = os.pwrite(fd, view, offset)
                    view, offset = view[n:], offset + n
            except OSError as e:  # name the file: "disk full" must say where
                raise OSError(e.errno, e.strerror, str(self.tmp)) from None
            if nbytes >= WRITEBACK_BYTES:
                # The device starts on this piece now, not once the whole blob is
                # copied (:meth:`written`): a save's first bytes reach it a blob's copy
                # earlier (measured: 145 -> 139 ms median for 256 MiB, the disk's own
                # 129). An unnamed blob's too: written on a guess that it is new, it
                # is dropped if the guess loses, and only the pieces written while
                # it was hashed went to the device for nothing.
                start_writeback(fd, start, nbytes)

    def commit(self, before_publish: Callable[[], None] | None = None) -> None:
        self.sync()
        self.publish(before_publish)
        for d in sorted(self.dirs):
            fsync_dir(d)

    def written(self) -> None:
        # The device writes this blob while later ones are still hashed and copied;
        # the thread is free at once (an fsync here held it for tens of ms).
        with self._fd.use() as fd:
            start_writeback(fd)

    def sync(self) -> None:
        """Make the bytes durable and close the file (step 1 of :meth:`commit`)."""
        try:
            with self._fd.use() as fd:
                # Durable before visible: a published name must never point at lost blocks.
                try:
                    os.fsync(fd)
                except OSError as e:
                    raise OSError(e.errno, e.strerror, str(self.tmp)) from None
        finally:
            self._fd.close()

    def publish(self, before_publish: Callable[[], None] | None = None) -> None:
        """Rename the synced file into place (step 2; the directories' fsync is step 3)."""
        try:
            if self.final is None:
                raise ValueError("a blob from start_blob must be named before its commit")
            if before_publish is not None:
                before_publish()
            # Content-addressed: if another writer published the same name first, its
            # bytes are ours, so replacing it is harmless. (From start_blob's directory,
            # a rename across directories of one filesystem: atomic too.)
            os.replace(self.tmp, self.final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                self.tmp.unlink()
            raise

    def abort(self) -> None:
        self._fd.close()  # waits for a write still in flight on another thread
        with contextlib.suppress(FileNotFoundError):
            self.tmp.unlink()
