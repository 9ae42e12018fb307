"""Checkpoint storage on any fsspec filesystem (s3://, gs://, memory://, ...).

Object stores have no rename and no directories. Every write is therefore one
whole-object PUT (a reader sees the old object, the new one, or none, never a torn
one), data objects are put before the manifest, and the manifest is put with a
conditional create (``If-None-Match: *``) where the store supports it. A "directory"
exists when some key has it as a prefix, so "missing" and "empty" are the same.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from .._rngshield import shield_libraries
from .storage import CheckpointStorage, FileInfo, LocalStorage, check_relpath


class FsspecStorage(CheckpointStorage):
    """Checkpoint storage below ``url`` on the fsspec filesystem it names."""

    def __init__(self, url: str, **storage_options: Any) -> None:
        import fsspec

        self.url = url.rstrip("/")
        self.fs, root = fsspec.core.url_to_fs(self.url, **storage_options)
        self.root = root.rstrip("/")
        shield_libraries()  # an object store's retry jitter must not move a step's random stream

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r})"

    def _abs(self, relpath: str) -> str:
        parts = check_relpath(relpath).parts
        return "/".join((self.root, *parts)) if parts and parts != (".",) else self.root

    def _rel(self, abspath: str) -> str:
        return abspath.removeprefix(self.root.lstrip("/")).removeprefix(self.root).lstrip("/")

    @contextlib.contextmanager
    def open_write(
        self, relpath: str, *, before_publish: Callable[[], None] | None = None,
        durable: bool = True,  # a PUT is durable when it returns: nothing to skip
    ) -> Iterator[BinaryIO]:
        if not check_relpath(relpath).parts:
            raise ValueError("storage path '' names the root; pass a file path")
        buf = io.BytesIO()
        yield buf
        if before_publish is not None:
            before_publish()
        self.fs.pipe_file(self._abs(relpath), buf.getvalue())

    def publish(
        self, relpath: str, data: bytes, *, before_publish: Callable[[], None] | None = None
    ) -> None:
        if self.exists(relpath):  # cheap early answer; the conditional PUT is the real guard
            raise FileExistsError(f"{relpath} already exists")
        if before_publish is not None:
            before_publish()
        try:
            self.fs.pipe_file(self._abs(relpath), data, mode="create")
        except TypeError:  # a filesystem without conditional create: check-then-put
            self.fs.pipe_file(self._abs(relpath), data)
        except FileExistsError:
            raise
        except OSError as e:  # s3fs maps 412 Precondition Failed to an OSError
            if "PreconditionFailed" in str(e) or "412" in str(e):
                raise FileExistsError(f"{relpath} already exists") from None
            raise

    def open_read(self, relpath: str) -> BinaryIO:
        try:
            f: BinaryIO = self.fs.open(self._abs(relpath), "rb", block_size=16 << 20)
        except IsADirectoryError:
            raise FileNotFoundError(relpath) from None
        return f

    def read_bytes(self, relpath: str) -> bytes:
        data: bytes = self.fs.cat_file(self._abs(relpath))
        return data

    def size(self, relpath: str) -> int:
        info = self.fs.info(self._abs(relpath))
        if info.get("type") == "directory":
            raise FileNotFoundError(relpath)
        return int(info["size"])

    def exists(self, relpath: str) -> bool:
        return bool(self.fs.exists(self._abs(relpath)))

    def listdir(self, reldir: str) -> list[str]:
        try:
            entries = self.fs.ls(self._abs(reldir), detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = self._abs(reldir).strip("/")
        names = {e.strip("/").rsplit("/", 1)[-1] for e in entries if e.strip("/") != base}
        return sorted(names)

    def move(self, src: str, dst: str) -> None:
        if not check_relpath(src).parts or not check_relpath(dst).parts:
            raise ValueError("cannot move the storage root; pass paths below it")
        if self.exists(dst):
            raise FileExistsError(f"cannot move {src!r} to {dst!r}: the target exists")
        s = self._abs(src)
        files = self.fs.find(s)
        if not files or files == [s.lstrip("/")] or files == [s]:
            self.fs.copy(s, self._abs(dst))  # one object
            self.fs.rm_file(s)
            return
        # Copy everything, then delete: a crash in between leaves two copies, never none.
        # The manifest is copied last so the target is never a checkpoint missing files.
        rels = sorted(files, key=lambda f: f.endswith("MANIFEST.json"))
        for f in rels:
            rel = f.strip("/")[len(s.strip("/")) + 1 :]
            self.fs.copy(f, self._abs(f"{dst}/{rel}"))
        for f in sorted(files, key=lambda f: not f.endswith("MANIFEST.json")):
            self.fs.rm_file(f)

    def remove_tree(self, reldir: str) -> None:
        if not check_relpath(reldir).parts:
            raise ValueError("cannot remove the storage root; pass a directory below it")
        p = self._abs(reldir)
        with contextlib.suppress(FileNotFoundError):
            if self.fs.isfile(p):
                self.fs.rm_file(p)
            else:
                for f in self.fs.find(p):
                    self.fs.rm_file(f)

    def walk(self, reldir: str) -> list[FileInfo]:
        try:
            found = self.fs.find(self._abs(reldir), detail=True)
        except FileNotFoundError:
            return []
        out = [
            FileInfo(self._rel(name), int(info.get("size", 0)), _mtime(info))
            for name, info in found.items()
            if info.get("type") != "directory"
        ]
        return sorted(out, key=lambda i: i.path)

    def remove(self, relpath: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(self._abs(relpath))


def _mtime(info: dict[str, Any]) -> float:
    for key in ("LastModified", "mtime", "created", "updated", "last_modified"):
        v = info.get(key)
        if isinstance(v, datetime):
            return v.timestamp()
        if isinstance(v, int | float):
            return float(v)
        if isinstance(v, str):
            with contextlib.suppress(ValueError):
                return datetime.fromisoformat(v.replace("Z", "+00:00")).timestamp()
    return 0.0  # unknown: treated as old, so only the marker protects it


def open_storage(url_or_path: str | Path, **storage_options: Any) -> CheckpointStorage:
    """A storage for a local path or ``file://`` URL (LocalStorage), or any fsspec URL."""
    s = str(url_or_path)
    if isinstance(url_or_path, Path) or "://" not in s:
        return LocalStorage(s)
    if s.startswith("file://"):
        return LocalStorage(s.removeprefix("file://"))
    return FsspecStorage(s, **storage_options)
