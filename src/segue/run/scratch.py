"""``ctx.scratch``: a task's local directory, saved with each checkpoint and put back.

A step declared ``@flow.step(scratch="2GB")`` gets, in each attempt, an empty local
directory ``HOME/work/RUN/TASK/e<epoch>/scratch`` (never under checkpoint storage).
Before the step function runs, the worker restores the step's checkpoint
(:meth:`StepContext.prepare_scratch`) and fills the directory with the files that
checkpoint saved; ``ctx.restore()`` then returns that same checkpoint's state. Every
checkpoint the step commits copies the directory's files (``e<epoch>/snap-<seq>``)
at the moment of the call and saves the copies as blobs of that checkpoint
(:mod:`segue.checkpoint.scratch`); the copies are removed once the save has ended.

An attempt's directory is removed when the attempt ends; one left by a killed
attempt is removed by the next attempt of the task.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from ..checkpoint import scratch as ckpt_scratch
from ..checkpoint.format import Manifest
from ..checkpoint.storage import CheckpointStorage
from ..home import Home, check_run_id
from ..units import format_bytes


def base_dir(home: Home | None, run_id: str, task: str) -> Path:
    """Where the attempts of ``task`` keep their scratch directories."""
    if home is None:  # a context made outside a worker (a test): a private temp dir
        return Path(tempfile.mkdtemp(prefix="segue-scratch-")) / task
    return home.root / "work" / check_run_id(run_id) / task


class ScratchArea:
    """One attempt's scratch directory and its checkpoint snapshots."""

    def __init__(self, base: Path, epoch: int, limit: int, *, task: str) -> None:
        self.base = base
        self.attempt_dir = base / f"e{epoch}"
        self.path = self.attempt_dir / "scratch"
        self.limit = limit
        self.task = task
        self.restored_seq: int | None = None  # the checkpoint whose files it holds

    def open(self) -> None:
        """Create the directory empty, removing what earlier attempts left behind."""
        if self.base.exists():
            for old in self.base.iterdir():
                if old != self.attempt_dir:
                    shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(self.attempt_dir, ignore_errors=True)
        self.path.mkdir(parents=True)

    def restore(self, storage: CheckpointStorage, seq: int, path: str, manifest: Manifest) -> None:
        """Hold exactly the files checkpoint ``seq`` saved (unless it does already).
        CheckpointCorruptError if one of them does not verify (the directory is empty then)."""
        if self.restored_seq == seq:
            return
        self.restored_seq = None
        ckpt_scratch.restore(storage, path, manifest, self.path)
        self.restored_seq = seq

    def snapshot(self, seq: int) -> ckpt_scratch.Snapshot:
        """Copy the directory's files now, for checkpoint ``seq``; over the limit: refused."""
        limit = format_bytes(self.limit)
        return ckpt_scratch.snapshot(
            self.path, self.attempt_dir / f"snap-{seq}", limit=self.limit,
            what=f"ctx.scratch of step {self.task!r}",
            fix=(f"delete files from ctx.scratch before calling ctx.checkpoint, or declare a larger "
                 f"@flow.step(scratch=...) than {limit!r}"))

    def drop(self) -> None:
        """Remove this attempt's directory (the attempt ended: its checkpoints hold the files)."""
        shutil.rmtree(self.attempt_dir, ignore_errors=True)
        for d in (self.base, self.base.parent):  # the task's, then the run's, once empty
            with contextlib.suppress(OSError):
                d.rmdir()
