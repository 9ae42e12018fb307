"""Files through fsspec: listing, snapshots and the file-backed sources.

Shard order (documented, deterministic): the snapshot lists files sorted by
their full path (``include-new`` appends newer files after them, sorted);
each file is cut into consecutive byte ranges of ``shard_bytes`` (JSONL) or
row ranges of whole row groups (Parquet); CSV files are one shard each,
because a quoted field may hold a newline and a byte offset alone cannot tell
a record boundary without parsing from the start. Shard keys are
``FFFFF.RRRR`` (file index, range index), with ``a``/``b`` appended by splits.
"""

from __future__ import annotations

import glob as _glob
import os
import stat
from abc import abstractmethod
from typing import Any

from ..errors import MissingInputError, PositionError
from .base import Shard, Source

DEFAULT_SHARD_BYTES = 64 << 20


class LocalFiles:
    """The local disk as the file sources use it: the calls and answers of fsspec's
    LocalFileSystem they need, without importing fsspec (and asyncio with it) into
    every worker's start-up. Globs are still fsspec's, so their meaning is one."""

    protocol = ("file", "local")

    def info(self, path: str) -> dict[str, Any]:
        st = os.stat(path)
        return {"name": path, "size": st.st_size, "mtime": st.st_mtime,
                "type": "directory" if stat.S_ISDIR(st.st_mode) else "file"}

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def isfile(self, path: str) -> bool:
        return os.path.isfile(path)

    def find(self, path: str) -> list[str]:
        """Every file under ``path``, sorted; symlinked folders are followed (fsspec's
        find lists such a link as a file, which no reader could open)."""
        return sorted(os.path.join(d, f) for d, _, files in os.walk(path, followlinks=True) for f in files)

    def glob(self, pattern: str) -> list[str]:
        from fsspec.implementations.local import LocalFileSystem

        return list(LocalFileSystem().glob(pattern))


LOCAL = LocalFiles()


def _to_fs(url: str) -> tuple[Any, str]:
    """(filesystem, path) of a URL; a plain path or ``file://`` URL is the local disk."""
    if "://" not in url or url.startswith("file://"):
        path = url[len("file://"):] if url.startswith("file://") else url
        return LOCAL, os.path.abspath(os.path.expanduser(path)) if path else path
    from fsspec.core import url_to_fs

    return url_to_fs(url)


def list_files(urls: str | list[str]) -> tuple[Any, list[str]]:
    """(filesystem, sorted paths) for a file, a directory, a glob, or a list of them.

    Each of them must name at least one file (MissingInputError otherwise): an
    empty input is a wrong path far more often than a real empty dataset, and a
    step that read nothing would succeed with 0 records. Listing only: no file is read.
    """
    urls = [urls] if isinstance(urls, str | os.PathLike) else list(urls)
    fs = None
    paths: set[str] = set()
    for url in urls:
        fs_i, path = _to_fs(os.fspath(url))
        if fs is None:
            fs = fs_i
        elif type(fs_i) is not type(fs):
            raise ValueError(f"all inputs must be on one filesystem; {url!r} is not")
        if _glob.has_magic(path):
            found = [p for p in fs_i.glob(path) if fs_i.isfile(p)]
            what = "{} matches no file; check the path or the glob"
        elif fs_i.isdir(path):
            found = _published_only(fs_i, [p for p in fs_i.find(path) if not _hidden(p, path)])
            what = ("directory {} holds no input file (names that start with '.' or '_' are "
                    "skipped); check the path, or put the files there first")
        else:
            found = [path] if fs_i.isfile(path) else []
            what = "file {} does not exist; check the path"
        if not found:
            raise MissingInputError(_missing(os.fspath(url), what))
        paths.update(found)
    if fs is None:
        raise ValueError("no input files given")
    return fs, sorted(paths)


def _missing(url: str, what: str) -> str:
    """``input ...`` with the URL as given, saying where a relative local path was looked for."""
    path = url[len("file://"):] if url.startswith("file://") else url
    rel = "://" not in path and not os.path.isabs(os.path.expanduser(path))
    where = f" (relative paths resolve from the working directory, {os.getcwd()})" if rel else ""
    return f"input {what.format(repr(url))}{where}"


def _published_only(fs: Any, found: list[str]) -> list[str]:
    """Drop part files of segue sink directories that are outside their published set.

    A sink directory's marker (segue.data.sinks.owner) says which parts are
    published; a reader of the directory sees that set, never the parts of a
    run an overwrite replaced. Local disks only (the file sinks are local).
    """
    if "file" not in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        return found
    from ..sinks.owner import unpublished

    hidden: dict[str, set[str]] = {}
    out = []
    for p in found:
        d, name = os.path.split(p)
        if d not in hidden:
            hidden[d] = unpublished(d)
        if name not in hidden[d]:
            out.append(p)
    return out


def _hidden(p: str, root: str) -> bool:
    rel = p[len(root):].lstrip("/")
    return any(part.startswith((".", "_")) for part in rel.split("/"))


def file_attrs(fs: Any, path: str) -> dict[str, Any]:
    """Size plus whatever change marker the filesystem offers (mtime, etag)."""
    info = fs.info(path)
    attrs: dict[str, Any] = {"size": int(info.get("size") or 0)}
    for key in ("ETag", "etag", "md5Hash", "generation"):
        if info.get(key):
            attrs["etag"] = str(info[key]).strip('"')
            break
    else:
        mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified")
        if mtime is not None:
            attrs["mtime"] = mtime if isinstance(mtime, int | float) else str(mtime)
    return attrs


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


class FileSource(Source):
    """Base of the file formats: lists files through fsspec, snapshots them."""

    kind = "files"

    def __init__(self, urls: str | list[str]) -> None:
        self.urls = urls
        self._fs: Any = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, _ = list_files(self.urls)
        return self._fs

    def open(self, path: str) -> Any:
        if is_local(self.fs):
            return open(path, "rb", buffering=1 << 20)
        import fsspec

        return fsspec.open(path if "://" in path else f"{self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]}://{path}", "rb").open()

    def item_attrs(self, path: str) -> dict[str, Any]:
        return file_attrs(self.fs, path)

    def snapshot(self) -> dict[str, Any]:
        self._fs, paths = list_files(self.urls)
        return {"kind": self.kind, "items": {p: self.item_attrs(p) for p in paths}}

    def shards(self, snapshot: dict[str, Any]) -> list[Shard]:
        out: list[Shard] = []
        for i, (path, attrs) in enumerate(snapshot["items"].items()):
            out.extend(self.file_shards(i, path, attrs))
        return out

    @abstractmethod
    def file_shards(self, index: int, path: str, attrs: dict[str, Any]) -> list[Shard]:
        ...

    @abstractmethod
    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        ...


def check_kind(data: dict[str, Any], kind: str) -> None:
    if data.get("kind") != kind:
        raise PositionError(f"shard {data!r} is not a {kind} shard")
