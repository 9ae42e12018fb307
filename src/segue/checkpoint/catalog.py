"""Look at checkpoints without loading them: list, describe, verify many.

The library beneath ``segue ckpt``; it returns data, and never prints.
:func:`locate` turns a user's path or URL into (storage, checkpoint paths): a
checkpoint directory, or a directory of checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CheckpointCorruptError, CheckpointError
from .blobs import BLOB_DIR
from .format import MANIFEST_NAME, Manifest
from .fsspec_storage import open_storage
from .io import list_dir_checkpoints, read_manifest, verify
from .storage import CheckpointStorage
from .tree import TAG


@dataclass(frozen=True)
class CheckpointSummary:
    path: str
    version: int
    created_at: str
    step: Any
    nbytes: int
    nfiles: int
    narrays: int
    tags: tuple[str, ...]


MANAGER_PREFIX = "checkpoints"
"""Where :class:`~.manager.CheckpointManager` puts its checkpoints under its storage."""


def locate(url_or_path: str | Path) -> tuple[CheckpointStorage, str, bool]:
    """(storage, relative path, is_checkpoint) for a checkpoint or a directory of them.

    A directory of checkpoints is either their parent, or the storage root given to
    :class:`~.manager.CheckpointManager` (its checkpoints are under ``checkpoints/``);
    if it holds none, the path is "" below the storage and the caller lists nothing.
    For a single v2 checkpoint the storage root is the nearest ancestor that holds
    its blobs, because v2 manifests name blobs relative to that root.
    """
    text = str(url_or_path)
    if "://" not in text:  # absolute, so that a checkpoint in the cwd has ancestors
        text = str(Path(text).absolute())
    text = text.rstrip("/") or "/"
    storage = open_storage(text)
    if storage.exists(MANIFEST_NAME):
        return _locate_one(text)
    for prefix in ("", MANAGER_PREFIX):
        children = list_dir_checkpoints(storage, prefix)
        # The directory's root is the root of its checkpoints: the first readable one.
        for child in children:
            root, rel, _ = _locate_one(f"{text}/{child}")
            if _readable(root, rel):
                return root, rel.rsplit("/", 1)[0] if "/" in rel else "", False
        if children:
            return storage, prefix, False
    return storage, "", False


def _readable(storage: CheckpointStorage, path: str) -> bool:
    try:
        read_manifest(storage, path)
    except CheckpointCorruptError:
        return False
    return True


def _locate_one(text: str) -> tuple[CheckpointStorage, str, bool]:
    parts = text.split("/")
    fallback: tuple[CheckpointStorage, str, bool] | None = None
    root_found = False
    for cut in range(1, len(parts)):
        prefix = "/".join(parts[:-cut]) or "/"
        if "://" in text and prefix.endswith(":/"):
            break
        candidate = open_storage(prefix)
        rel = "/".join(parts[-cut:])
        if fallback is None:
            # A bad manifest has no trustworthy file list: verify reports it from here.
            fallback = candidate, rel, True
        try:
            m = read_manifest(candidate, rel)
        except CheckpointCorruptError:
            return fallback
        if m.version == 1 or not m.files or any(candidate.exists(f) for f in m.files):
            return candidate, rel, True
        if not root_found and candidate.exists(BLOB_DIR):
            # Every blob is gone but this is a storage root: verify says which are missing.
            fallback, root_found = (candidate, rel, True), True
    if fallback is None:
        raise CheckpointError(f"{text} is not a checkpoint path; pass a checkpoint or its directory")
    return fallback


def summarize(storage: CheckpointStorage, path: str) -> CheckpointSummary:
    m = read_manifest(storage, path)
    return CheckpointSummary(
        path, m.version, m.created_at, m.meta.get("step"),
        sum(f.size for f in m.files.values()), len(m.files), len(m.arrays), m.tags,
    )


def list_checkpoints(storage: CheckpointStorage, prefix: str = "") -> list[CheckpointSummary | str]:
    """A summary per checkpoint under ``prefix`` (a str detail for unreadable ones)."""
    out: list[CheckpointSummary | str] = []
    for path in list_dir_checkpoints(storage, prefix):
        try:
            out.append(summarize(storage, path))
        except CheckpointCorruptError as e:
            out.append(f"{path}: {e.detail}")
    return out


def describe_tree(m: Manifest) -> list[tuple[str, str]]:
    """(key path, description) for every leaf of the state tree: dtype and shape, or value."""
    rows: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, list):
            for i, x in enumerate(node):
                walk(x, f"{path}[{i}]")
            return
        if not isinstance(node, dict):
            rows.append((path, repr(node)))
            return
        tag = node.get(TAG)
        if tag is None:
            for k, x in node.items():
                walk(x, f"{path}.{k}" if path else k)
        elif tag in ("ndarray", "tensor"):
            a = m.arrays[node["ref"]]
            dtype = a.meta.get("dtype", a.dtype)
            dev = f" {a.meta['device']}" if a.meta.get("device", "cpu") != "cpu" else ""
            nbytes = _nbytes(a.dtype, a.shape)
            rows.append((path, f"{tag} {dtype} {list(a.shape)} {nbytes} B{dev}"))
        elif tag in ("tuple", "odict"):
            items = node["items"]
            walk(items, path)
        elif tag == "idict":  # int keys: an optimizer's per-parameter state, tensors inside
            for k, x in zip(node["keys"], node["values"], strict=False):
                walk(x, f"{path}[{k}]")
        else:
            rows.append((path, tag))

    walk(m.tree, "")
    return rows


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    import numpy as np

    n = np.dtype(dtype).itemsize
    for d in shape:
        n *= d
    return n


def verify_many(
    storage: CheckpointStorage, paths: list[str]
) -> list[tuple[str, str | None]]:
    """(path, None if it verifies else the failure detail) for each path."""
    out: list[tuple[str, str | None]] = []
    for p in paths:
        try:
            verify(storage, p)
            out.append((p, None))
        except CheckpointCorruptError as e:
            out.append((p, e.detail))
    return out
