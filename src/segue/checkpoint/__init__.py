"""Durable, verified checkpoints: save and load state trees without pickle.

The public surface is below; the modules behind it each own one concept:
``tree`` (state tree <-> JSON + arrays), ``safetensors_io`` (the tensor file),
``format`` (the manifest), ``storage`` (where bytes live), ``io`` (the commit
protocol). See docs/checkpoint-format.md for the on-disk layout.
"""

from __future__ import annotations

from .format import FORMAT, VERSION, ArrayEntry, FileEntry, Manifest, OpaqueEntry
from .io import (
    LoadResult,
    SaveResult,
    latest_valid,
    list_dir_checkpoints,
    load,
    quarantine,
    read_manifest,
    save,
    verify,
)
from .storage import CheckpointStorage, LocalStorage

__all__ = [
    "ArrayEntry",
    "CheckpointStorage",
    "FORMAT",
    "FileEntry",
    "LoadResult",
    "LocalStorage",
    "Manifest",
    "OpaqueEntry",
    "SaveResult",
    "VERSION",
    "latest_valid",
    "list_dir_checkpoints",
    "load",
    "quarantine",
    "read_manifest",
    "save",
    "verify",
]
