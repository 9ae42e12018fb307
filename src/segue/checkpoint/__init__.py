"""Durable, verified, incremental checkpoints: save and load state trees without pickle.

The public surface is below; the modules behind it each own one concept:
``tree`` (state tree <-> JSON + arrays), ``safetensors_io`` (the tensor file),
``format`` (the manifest), ``blobs`` (content-addressed blobs: plan, stage, hash),
``writer`` / ``reader`` (the v2 commit protocol, and reading v1 and v2),
``io`` (save/load/verify/quarantine), ``async_save`` (the Checkpointer),
``retention`` (keep policies and GC), ``interval`` (when to checkpoint),
``storage`` / ``fsspec_storage`` (where bytes live), ``catalog`` (ls/inspect),
``manager`` (a high-level API for any training loop), ``scratch`` (a directory's
files saved as blobs of a checkpoint and put back: ``ctx.scratch``).
See docs/checkpoint-format.md for the on-disk layout.
"""

from __future__ import annotations

from .async_save import Checkpointer, CheckpointerState, SaveCost
from .format import FORMAT, VERSION, ArrayEntry, FileEntry, Manifest, OpaqueEntry
from .fsspec_storage import FsspecStorage, open_storage
from .interval import IntervalDecision, IntervalPolicy, parse_duration
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
from .manager import CheckpointManager
from .retention import (
    CheckpointInfo,
    GcReport,
    PruneReport,
    RetentionPlan,
    RetentionPolicy,
    collect_garbage,
    plan_retention,
    prune,
)
from .storage import CheckpointStorage, LocalStorage
from .writer import WriteStats

__all__ = [
    "ArrayEntry",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointStorage",
    "Checkpointer",
    "CheckpointerState",
    "FORMAT",
    "FileEntry",
    "FsspecStorage",
    "GcReport",
    "IntervalDecision",
    "IntervalPolicy",
    "LoadResult",
    "LocalStorage",
    "Manifest",
    "OpaqueEntry",
    "PruneReport",
    "RetentionPlan",
    "RetentionPolicy",
    "SaveCost",
    "SaveResult",
    "VERSION",
    "WriteStats",
    "collect_garbage",
    "latest_valid",
    "list_dir_checkpoints",
    "load",
    "open_storage",
    "parse_duration",
    "plan_retention",
    "prune",
    "quarantine",
    "read_manifest",
    "save",
    "verify",
]
