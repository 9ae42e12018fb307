"""Read and verify checkpoints of format v1 and v2.

Every file a manifest lists is checked for size and xxh3_128; files are read in
parallel, each front to back, hashing in the same pass that copies the arrays
out. The reader never trusts a file: sizes, offsets and dtypes are checked
against the manifest, and any mismatch is a :class:`CheckpointCorruptError`.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, TypeVar

import xxhash

from ..errors import CheckpointCorruptError
from .blobs import BLOB_DIR
from .format import MANIFEST_NAME, FileEntry, Manifest, ManifestFormatError
from .safetensors_io import CHUNK, SafetensorsFormatError, read_safetensors, unpack
from .storage import CheckpointStorage, check_relpath

if TYPE_CHECKING:
    import numpy as np

T = TypeVar("T")


def read_manifest(storage: CheckpointStorage, path: str) -> Manifest:
    """Parse the manifest; CheckpointCorruptError if it is missing or unreadable."""
    try:
        raw = storage.read_bytes(f"{path}/{MANIFEST_NAME}")
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(path, "manifest missing") from None
    try:
        manifest = Manifest.from_json(raw)
    except ManifestFormatError as e:
        raise CheckpointCorruptError(path, f"manifest unreadable: {e}") from None
    for name in {a.file for a in manifest.arrays.values()} | {
        o.file for o in manifest.opaque.values()
    }:
        if name not in manifest.files:
            raise CheckpointCorruptError(path, f"manifest unreadable: {name} is not in files")
    for name in manifest.files:
        if not _file_name_ok(manifest.version, name):
            # A manifest is data, never trusted: one naming a file outside the checkpoint
            # (its directory for v1, blobs/ for v2) is corrupt like any other bad byte.
            raise CheckpointCorruptError(
                path, f"manifest unreadable: file {name!r} is outside the checkpoint"
            )
    return manifest


def _file_name_ok(version: int, name: str) -> bool:
    try:
        rel = check_relpath(name)
    except (TypeError, ValueError):
        return False
    if rel.as_posix() != name or name in ("", "."):
        return False  # "a//b", "./a": not a name the writer produces
    return version == 1 or rel.parts[0] == BLOB_DIR


def _map(pool: Executor | None, fn: Callable[[Any], T], items: list[Any]) -> list[T]:
    if pool is None or len(items) < 2:
        return [fn(i) for i in items]
    return list(pool.map(fn, items))


def check_size(storage: CheckpointStorage, path: str, m: Manifest, name: str) -> None:
    entry = m.files[name]
    try:
        size = storage.size(m.file_path(path, name))
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(path, f"blob {name}: missing") from None
    if size != entry.size:
        raise CheckpointCorruptError(path, f"blob {name}: size {size} != {entry.size}")


def check_hash(storage: CheckpointStorage, path: str, m: Manifest, name: str) -> None:
    hasher = xxhash.xxh3_128()
    with storage.open_read(m.file_path(path, name)) as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    if hasher.hexdigest() != m.files[name].xxh3_128:
        raise CheckpointCorruptError(path, f"blob {name}: checksum mismatch")


def verify_files(
    storage: CheckpointStorage, path: str, m: Manifest, pool: Executor | None = None
) -> None:
    """Size first (cheap, catches truncation), then the hash of every file."""
    names = list(m.files)
    for name in names:
        check_size(storage, path, m, name)
    _map(pool, lambda n: check_hash(storage, path, m, n), names)


def _read_tensor_file(
    storage: CheckpointStorage, path: str, m: Manifest, name: str, check: bool
) -> dict[str, np.ndarray]:
    entry: FileEntry = m.files[name]
    if check:
        check_size(storage, path, m, name)
    try:
        with storage.open_read(m.file_path(path, name)) as f:
            result = read_safetensors(f)
    except (FileNotFoundError, NotADirectoryError):
        raise CheckpointCorruptError(path, f"blob {name}: missing") from None
    except SafetensorsFormatError as e:
        if check:  # a corrupted file is better reported as what it is
            check_hash(storage, path, m, name)
        raise CheckpointCorruptError(path, f"blob {name}: {e}") from None
    if check and result.xxh3_128 != entry.xxh3_128:
        raise CheckpointCorruptError(path, f"blob {name}: checksum mismatch")
    for ref, a in m.arrays.items():
        if a.file == name and result.dtypes.get(m.tensor_name(ref)) != a.stored_as:
            raise CheckpointCorruptError(
                path, f"blob {name}: array {ref} does not match the manifest"
            )
    return result.arrays


def read_arrays(
    storage: CheckpointStorage,
    path: str,
    m: Manifest,
    check: bool,
    pool: Executor | None = None,
) -> dict[str, np.ndarray]:
    """Every array of the checkpoint by ref, files read in parallel."""
    names = sorted({a.file for a in m.arrays.values()})
    per_file = dict(
        zip(names, _map(pool, lambda n: _read_tensor_file(storage, path, m, n, check), names),
            strict=True)
    )
    return {
        ref: unpack(per_file[a.file][m.tensor_name(ref)], a.dtype, a.shape)
        for ref, a in m.arrays.items()
    }


def read_opaque(
    storage: CheckpointStorage, path: str, m: Manifest, check: bool
) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name in sorted({o.file for o in m.opaque.values()}):
        if check:
            check_size(storage, path, m, name)
        data = storage.read_bytes(m.file_path(path, name))
        if check and xxhash.xxh3_128_hexdigest(data) != m.files[name].xxh3_128:
            raise CheckpointCorruptError(path, f"blob {name}: checksum mismatch")
        for ref, o in m.opaque.items():
            if o.file == name:
                if o.offset + o.size > len(data):
                    raise CheckpointCorruptError(path, f"blob {name}: opaque {ref} out of range")
                out[ref] = data[o.offset : o.offset + o.size]
    return out
