"""Save, load, verify and quarantine checkpoints: the commit protocol.

A checkpoint is a directory holding ``tensors.safetensors`` (every array, one file),
``opaque.bin`` (pickled values, only with allow_pickle) and ``MANIFEST.json``.
Data files are made durable first; the manifest, which lists every file's size and
hash, is published last by an atomic rename. No manifest means no checkpoint, so a
crash at any moment leaves either the complete checkpoint or none. Checkpoints are
immutable: saving over a published one is refused.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import xxhash

from .._faults import fault_point
from ..errors import CheckpointCorruptError, CheckpointError, StateTypeError
from .format import MANIFEST_NAME, ArrayEntry, FileEntry, Manifest, ManifestFormatError, OpaqueEntry
from .safetensors_io import (
    CHUNK,
    SafetensorsFormatError,
    pack,
    read_safetensors,
    unpack,
    write_safetensors,
)
from .storage import CheckpointStorage, check_relpath
from .tree import Encoded, MalformedTreeError, decode, encode

TENSORS_FILE = "tensors.safetensors"
OPAQUE_FILE = "opaque.bin"
QUARANTINE_DIR = "quarantine"


@dataclass(frozen=True)
class SaveResult:
    path: str
    nbytes: int
    files: dict[str, FileEntry]
    manifest: Manifest


@dataclass(frozen=True)
class LoadResult:
    state: Any
    manifest: Manifest


def _norm(path: str) -> str:
    p = check_relpath(path).as_posix()
    if p in ("", "."):
        raise ValueError("checkpoint path is empty; pass a directory below the storage root")
    return p


def _versions() -> dict[str, str]:
    # Read from package metadata, so recording torch's version never imports torch.
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("segue", "torch"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            if dist == "segue":  # run from a source tree that was never installed
                versions[dist] = "unknown"
    return versions


def _check_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    try:
        checked: dict[str, Any] = json.loads(json.dumps(dict(meta), allow_nan=False))
        return checked
    except (TypeError, ValueError) as e:
        raise StateTypeError(
            f"checkpoint meta must be plain JSON (str keys, finite numbers) but is not ({e}); "
            "convert it"
        ) from None


def _write_tensors(
    storage: CheckpointStorage, path: str, enc: Encoded
) -> tuple[dict[str, ArrayEntry], FileEntry]:
    stored: dict[str, np.ndarray] = {}
    names: dict[str, str] = {}
    entries: dict[str, ArrayEntry] = {}
    for ref, arr in enc.arrays.items():
        meta = enc.array_meta[ref]
        stored[ref], names[ref] = pack(arr)
        if meta.get("dtype") == "bfloat16":  # uint16 bits: name them BF16 for other readers
            names[ref] = "BF16"
        entries[ref] = ArrayEntry(TENSORS_FILE, arr.dtype.str, tuple(arr.shape), names[ref], meta)
    with storage.open_write(f"{path}/{TENSORS_FILE}") as f:
        info = write_safetensors(f, stored, dtypes=names, metadata={"format": "segue.checkpoint"})
    return entries, FileEntry(info.size, info.xxh3_128)


def _write_opaque(
    storage: CheckpointStorage, path: str, enc: Encoded
) -> tuple[dict[str, OpaqueEntry], FileEntry]:
    entries: dict[str, OpaqueEntry] = {}
    hasher, offset = xxhash.xxh3_128(), 0
    with storage.open_write(f"{path}/{OPAQUE_FILE}") as f:
        for ref, blob in enc.opaque.items():
            f.write(blob)
            hasher.update(blob)
            entries[ref] = OpaqueEntry(OPAQUE_FILE, offset, len(blob), enc.opaque_types[ref])
            offset += len(blob)
    return entries, FileEntry(offset, hasher.hexdigest())


def save(
    storage: CheckpointStorage,
    path: str,
    state: Any,
    *,
    meta: Mapping[str, Any] | None = None,
    allow_pickle: bool = False,
) -> SaveResult:
    """Write ``state`` as an immutable checkpoint directory ``path``; publish it last."""
    path = _norm(path)
    fault_point("checkpoint.start")
    manifest_path = f"{path}/{MANIFEST_NAME}"
    if storage.exists(manifest_path):
        raise CheckpointError(
            f"checkpoint {path} already exists and checkpoints are immutable; save to a new path"
        )
    # Encode before writing anything, so a state that cannot be stored writes nothing.
    enc = encode(state, allow_pickle=allow_pickle)
    meta_json = _check_meta(meta or {})
    written: list[str] = []
    try:
        files: dict[str, FileEntry] = {}
        arrays: dict[str, ArrayEntry] = {}
        opaque: dict[str, OpaqueEntry] = {}
        if enc.arrays:
            written.append(TENSORS_FILE)
            arrays, files[TENSORS_FILE] = _write_tensors(storage, path, enc)
        if enc.opaque:
            written.append(OPAQUE_FILE)
            opaque, files[OPAQUE_FILE] = _write_opaque(storage, path, enc)
        fault_point("checkpoint.blob_written")
        manifest = Manifest(
            created_at=datetime.now(UTC).isoformat(timespec="microseconds"),
            meta=meta_json,
            versions=_versions(),
            tree=enc.tree,
            arrays=arrays,
            files=files,
            opaque=opaque,
        )
        storage.write_bytes_atomic(
            manifest_path,
            manifest.to_json().encode(),
            before_publish=lambda: fault_point("checkpoint.manifest_tmp"),
        )
        fault_point("checkpoint.published")
    except BaseException:
        # Until the manifest is in place these files are garbage; remove them so a
        # failed save leaves nothing behind. Once it is in place they are the
        # checkpoint and must stay, even if something after the rename failed.
        if not storage.exists(manifest_path):
            for name in written:
                with contextlib.suppress(OSError):
                    storage.remove_tree(f"{path}/{name}")
        raise
    return SaveResult(path, sum(f.size for f in files.values()), files, manifest)


def read_manifest(storage: CheckpointStorage, path: str) -> Manifest:
    """Parse the manifest; CheckpointCorruptError if it is missing or unreadable."""
    path = _norm(path)
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
    return manifest


def _check_size(storage: CheckpointStorage, path: str, name: str, entry: FileEntry) -> None:
    try:
        size = storage.size(f"{path}/{name}")
    except FileNotFoundError:
        raise CheckpointCorruptError(path, f"blob {name}: missing") from None
    if size != entry.size:
        raise CheckpointCorruptError(path, f"blob {name}: size {size} != {entry.size}")


def _check_hash(storage: CheckpointStorage, path: str, name: str, entry: FileEntry) -> None:
    hasher = xxhash.xxh3_128()
    with storage.open_read(f"{path}/{name}") as f:
        while chunk := f.read(CHUNK):
            hasher.update(chunk)
    if hasher.hexdigest() != entry.xxh3_128:
        raise CheckpointCorruptError(path, f"blob {name}: checksum mismatch")


def verify(storage: CheckpointStorage, path: str) -> Manifest:
    """Check the manifest and every file's size and hash; return the manifest."""
    path = _norm(path)
    manifest = read_manifest(storage, path)
    for name, entry in manifest.files.items():
        _check_size(storage, path, name, entry)
        _check_hash(storage, path, name, entry)
    return manifest


def _read_arrays(
    storage: CheckpointStorage, path: str, manifest: Manifest, check: bool
) -> dict[str, np.ndarray]:
    if not manifest.arrays:
        return {}
    entry = manifest.files[TENSORS_FILE]
    if check:
        _check_size(storage, path, TENSORS_FILE, entry)
    # One pass: the reader hashes the whole file while copying the arrays out.
    try:
        with storage.open_read(f"{path}/{TENSORS_FILE}") as f:
            result = read_safetensors(f)
    except SafetensorsFormatError as e:
        if check:  # a corrupted file is better reported as what it is
            _check_hash(storage, path, TENSORS_FILE, entry)
        raise CheckpointCorruptError(path, f"blob {TENSORS_FILE}: {e}") from None
    if check and result.xxh3_128 != entry.xxh3_128:
        raise CheckpointCorruptError(path, f"blob {TENSORS_FILE}: checksum mismatch")
    arrays = {}
    for ref, a in manifest.arrays.items():
        if result.dtypes.get(ref) != a.stored_as:
            raise CheckpointCorruptError(
                path, f"blob {TENSORS_FILE}: array {ref} does not match the manifest"
            )
        arrays[ref] = unpack(result.arrays[ref], a.dtype, a.shape)
    return arrays


def _read_opaque(
    storage: CheckpointStorage, path: str, manifest: Manifest, check: bool
) -> dict[str, bytes]:
    if not manifest.opaque:
        return {}
    entry = manifest.files[OPAQUE_FILE]
    if check:
        _check_size(storage, path, OPAQUE_FILE, entry)
    data = storage.read_bytes(f"{path}/{OPAQUE_FILE}")
    if check and xxhash.xxh3_128_hexdigest(data) != entry.xxh3_128:
        raise CheckpointCorruptError(path, f"blob {OPAQUE_FILE}: checksum mismatch")
    return {ref: data[o.offset : o.offset + o.size] for ref, o in manifest.opaque.items()}


def load(
    storage: CheckpointStorage, path: str, *, allow_pickle: bool = False, verify: bool = True
) -> LoadResult:
    """Read and (by default) verify a checkpoint, then rebuild its state."""
    path = _norm(path)
    manifest = read_manifest(storage, path)
    if verify:  # files the readers below do not cover
        for name in manifest.files.keys() - {TENSORS_FILE, OPAQUE_FILE}:
            _check_size(storage, path, name, manifest.files[name])
            _check_hash(storage, path, name, manifest.files[name])
    arrays = _read_arrays(storage, path, manifest, verify)
    opaque = _read_opaque(storage, path, manifest, verify)
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
    storage.move(path, dst)
    storage.write_bytes_atomic(f"{dst}/REASON.txt", f"{path}: {reason}\n".encode())
    return dst


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
