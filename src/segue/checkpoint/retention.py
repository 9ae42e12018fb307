"""Which checkpoints to keep, and garbage collection of the blobs nobody uses.

:func:`plan_retention` is pure: given the checkpoints of a directory (oldest
first) and a :class:`RetentionPolicy`, it says which to keep and why. :func:`prune`
applies a plan to storage, then :func:`collect_garbage` deletes unreferenced blobs.

GC must never delete a blob that a live checkpoint uses, nor one that a save
running at the same time is about to reference. It keeps every blob that is
(a) listed by any manifest under the storage root (quarantine excepted), (b) named
by a pending-save marker younger than ``marker_ttl_s``, or (c) younger than
``grace_s``. A writer also re-checks its reused blobs after publishing and puts
back any that a racing GC removed (see :mod:`.writer`). It also deletes what dead
writers left, once older than ``grace_s``: blob temp files, and the temp files of
manifests staged beside a checkpoint's manifest name but never published.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import CheckpointCorruptError, CheckpointError
from .blobs import BLOB_DIR, PENDING_DIR
from .format import MANIFEST_NAME
from .reader import read_manifest, verify_files
from .storage import TEMP_MARK, CheckpointStorage, FileInfo

QUARANTINE_PREFIX = "quarantine/"


@dataclass(frozen=True)
class RetentionPolicy:
    """keep_last newest checkpoints, every checkpoint whose step is a multiple of
    keep_every, and (with keep_tagged) every tagged one. The newest valid checkpoint
    is always kept, whatever the policy says."""

    keep_last: int = 3
    keep_every: int | None = None
    keep_tagged: bool = True

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, not {self.keep_last}")
        if self.keep_every is not None and self.keep_every < 1:
            raise ValueError(f"keep_every must be >= 1 or None, not {self.keep_every}")


@dataclass(frozen=True)
class CheckpointInfo:
    path: str
    step: int | None = None
    tags: tuple[str, ...] = ()
    valid: bool = True


@dataclass(frozen=True)
class RetentionPlan:
    keep: list[str]
    delete: list[str]
    reasons: dict[str, str]
    """Why each kept checkpoint is kept (``last``, ``every``, ``tag:x``, ``newest-valid``)."""


def plan_retention(ckpts: Sequence[CheckpointInfo], policy: RetentionPolicy) -> RetentionPlan:
    """Decide which of ``ckpts`` (oldest first) to keep. Pure.

    Invalid checkpoints are never counted as kept-last and never deleted here:
    they are evidence, and quarantine is what moves them.
    """
    reasons: dict[str, str] = {}
    valid = [c for c in ckpts if c.valid]
    for c in valid[-policy.keep_last :]:
        reasons.setdefault(c.path, "last")
    if valid:
        reasons.setdefault(valid[-1].path, "newest-valid")
    for c in valid:
        if policy.keep_every and c.step is not None and c.step % policy.keep_every == 0:
            reasons.setdefault(c.path, "every")
        if policy.keep_tagged and c.tags:
            reasons.setdefault(c.path, f"tag:{c.tags[0]}")
    for c in ckpts:
        if not c.valid:
            reasons.setdefault(c.path, "invalid")
    keep = [c.path for c in ckpts if c.path in reasons]
    delete = [c.path for c in ckpts if c.path not in reasons]
    return RetentionPlan(keep, delete, reasons)


@dataclass
class GcReport:
    deleted: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    kept_live: int = 0
    kept_pending: int = 0
    kept_recent: int = 0


def _outside_blobs(storage: CheckpointStorage) -> list[FileInfo]:
    """Every file under the root but the blobs and the quarantine: each top-level
    directory walked on its own, so the blobs (the most files by far) are never listed."""
    skip = (BLOB_DIR, QUARANTINE_PREFIX.rstrip("/"))
    return [i for top in storage.listdir("") if top not in skip for i in storage.walk(top)]


def _manifest_dirs(files: Sequence[FileInfo]) -> list[str]:
    """The checkpoint directories among ``files`` (those holding a manifest)."""
    return [i.path.rsplit("/", 1)[0] for i in files
            if "/" in i.path and i.path.rsplit("/", 1)[-1] == MANIFEST_NAME]


def _live_blobs(storage: CheckpointStorage, manifest_dirs: Sequence[str]) -> set[str]:
    live: set[str] = set()
    for path in manifest_dirs:
        try:
            m = read_manifest(storage, path)
        except CheckpointCorruptError:
            continue  # unreadable: it references nothing we can know of
        if m.version >= 2:
            live.update(m.files)
    return live


def _pending_blobs(storage: CheckpointStorage, now: float, marker_ttl_s: float) -> set[str]:
    """The blobs that saves running now named in their markers (older markers, left by
    writers that died, are removed)."""
    pending: set[str] = set()
    for info in storage.walk(PENDING_DIR):
        if now - info.mtime > marker_ttl_s:
            storage.remove(info.path)  # left by a writer that died
            continue
        try:
            body = json.loads(storage.read_bytes(info.path))
            pending.update(str(b) for b in body.get("blobs", []))
        except (FileNotFoundError, ValueError):
            continue  # finished (removed) while we looked, or torn: both harmless
    return pending


def _stale_manifest_temps(files: Sequence[FileInfo], now: float, grace_s: float) -> list[FileInfo]:
    """Manifests staged by writers that died before publishing them: temp files beside
    a checkpoint's manifest name, never read, older than ``grace_s`` (a save running
    now has a young one)."""
    prefix = f".{MANIFEST_NAME}{TEMP_MARK}"
    return [i for i in files if i.path.rsplit("/", 1)[-1].startswith(prefix) and now - i.mtime >= grace_s]


def collect_garbage(
    storage: CheckpointStorage,
    *,
    grace_s: float = 600.0,
    marker_ttl_s: float = 6 * 3600.0,
    now: float | None = None,
    dry_run: bool = False,
) -> GcReport:
    """Delete blobs (and writer temp files, staged manifests' too) that nothing
    references; see the module docstring."""
    now = time.time() if now is None else now
    candidates = [i for i in storage.walk(BLOB_DIR) if not i.path.startswith(f"{PENDING_DIR}/")]
    others = _outside_blobs(storage)  # one listing for the manifests and the staged temp files
    live = _live_blobs(storage, _manifest_dirs(others))
    pending = _pending_blobs(storage, now, marker_ttl_s)
    report = GcReport()
    for info in candidates:
        if info.path in live:
            report.kept_live += 1
        elif info.path in pending:
            report.kept_pending += 1
        elif now - info.mtime < grace_s:
            report.kept_recent += 1
        else:
            report.deleted.append(info.path)
            report.freed_bytes += info.size
    for info in _stale_manifest_temps(others, now, grace_s):
        report.deleted.append(info.path)
        report.freed_bytes += info.size
    if not dry_run and report.deleted:
        # Markers written since we looked protect their blobs too: look once more
        # right before deleting, which shrinks the race to the delete calls themselves
        # (a save that published meanwhile puts back what it reused: see .writer).
        pending_now = _pending_blobs(storage, now, marker_ttl_s)
        for path in list(report.deleted):
            if path in pending_now:
                report.deleted.remove(path)
                report.kept_pending += 1
                continue
            storage.remove(path)
    return report


@dataclass
class PruneReport:
    plan: RetentionPlan
    removed: list[str]
    gc: GcReport | None


def describe_checkpoints(
    storage: CheckpointStorage, paths: Sequence[str], *, verify_newest: bool = True
) -> list[CheckpointInfo]:
    """CheckpointInfo for ``paths`` (oldest first); the newest valid one is fully verified."""
    infos: list[CheckpointInfo] = []
    for i, path in enumerate(paths):
        try:
            m = read_manifest(storage, path)
        except CheckpointCorruptError:
            infos.append(CheckpointInfo(path, valid=False))
            continue
        step = m.meta.get("step")
        infos.append(CheckpointInfo(path, step if type(step) is int else i, m.tags, True))
    if verify_newest:
        # "Never delete the last valid checkpoint" needs to know which one that is:
        # a readable manifest over a rotten blob is not valid.
        for idx in range(len(infos) - 1, -1, -1):
            c = infos[idx]
            if not c.valid:
                continue
            try:
                verify_files(storage, c.path, read_manifest(storage, c.path))
                break
            except CheckpointCorruptError:
                infos[idx] = CheckpointInfo(c.path, c.step, c.tags, valid=False)
    return infos


def prune(
    storage: CheckpointStorage,
    prefix: str,
    policy: RetentionPolicy,
    *,
    gc: bool = True,
    grace_s: float = 600.0,
    dry_run: bool = False,
) -> PruneReport:
    """Apply ``policy`` to the checkpoints directly under ``prefix``, then collect garbage."""
    from .io import list_dir_checkpoints  # io imports this module's neighbours

    paths = list_dir_checkpoints(storage, prefix)
    plan = plan_retention(describe_checkpoints(storage, paths), policy)
    if not any(r != "invalid" for r in plan.reasons.values()) and plan.delete:
        raise CheckpointError(
            f"no checkpoint under {prefix or '.'} verifies; prune refuses to delete any"
        )
    removed: list[str] = []
    if not dry_run:
        for path in plan.delete:
            # Manifest first: a crash midway leaves files without a manifest (not a
            # checkpoint, GC's business), never a manifest missing its files.
            storage.remove(f"{path}/{MANIFEST_NAME}")
            storage.remove_tree(path)
            removed.append(path)
    report = collect_garbage(storage, grace_s=grace_s, dry_run=dry_run) if gc else None
    return PruneReport(plan, removed, report)


def temp_files(storage: CheckpointStorage) -> list[str]:
    """Writer temp files under the blob directory (left by killed writers)."""
    return [i.path for i in storage.walk(BLOB_DIR) if TEMP_MARK in i.path]
