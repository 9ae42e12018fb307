"""A small high-level API for any training loop, outside a segue flow.

    mgr = CheckpointManager("s3://bucket/run1", keep_last=3, every="auto")
    start, state = mgr.restore_latest() or (0, init())   # raises if all are corrupt
    for step in range(start, n):
        ...
        if mgr.due(step):
            mgr.save(step, state)        # blocks only for the copy
    mgr.close()                          # waits until the last one is durable

Checkpoints are ``<prefix>/step-<step>`` directories; retention runs after each
save is durable. Restore verifies newest first and skips (or quarantines) bad ones;
if every checkpoint is bad it raises NoValidCheckpointError rather than start over.
``every_steps=N`` fires at steps N, 2N, ... (see :func:`.interval.next_multiple`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ..errors import CheckpointCorruptError, NoValidCheckpointError
from .async_save import Checkpointer
from .fsspec_storage import open_storage
from .interval import IntervalDecision, IntervalPolicy
from .io import SaveResult, list_dir_checkpoints, load, quarantine, read_manifest
from .like import check as check_like
from .retention import RetentionPolicy, prune
from .storage import CheckpointStorage

_STEP = re.compile(r"step-(\d+)$")


class CheckpointManager:
    def __init__(
        self,
        storage: str | Path | CheckpointStorage,
        *,
        prefix: str = "checkpoints",
        keep_last: int = 3,
        keep_every: int | None = None,
        every: str | float | None = None,
        every_steps: int | None = None,
        mtbf_s: float | None = None,
        max_in_flight: int = 1,
        allow_pickle: bool = False,
        quarantine_bad: bool = True,
    ) -> None:
        self.storage = (
            storage if isinstance(storage, CheckpointStorage) else open_storage(storage)
        )
        self.prefix = prefix.strip("/")
        self.policy = RetentionPolicy(keep_last=keep_last, keep_every=keep_every)
        if every is None and every_steps is None:
            every = "auto"
        self.interval = IntervalPolicy(every, every_steps, mtbf_s=mtbf_s)
        self.allow_pickle = allow_pickle
        self.quarantine_bad = quarantine_bad
        self.decisions: list[IntervalDecision] = [self.interval.decision]
        self._ckpt = Checkpointer(
            self.storage, max_in_flight=max_in_flight, allow_pickle=allow_pickle
        )

    def path(self, step: int) -> str:
        name = f"step-{step:010d}"
        return f"{self.prefix}/{name}" if self.prefix else name

    def steps(self) -> list[int]:
        out = []
        for p in list_dir_checkpoints(self.storage, self.prefix):
            m = _STEP.search(p)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def due(self, step: int | None = None) -> bool:
        return self.interval.due(step)

    def force(self) -> None:
        self.interval.force()

    def save(
        self,
        step: int,
        state: Any,
        *,
        meta: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        wait: bool = False,
    ) -> Future[SaveResult]:
        """Save ``state`` as step ``step``; returns once staged (``wait=True``: once durable)."""

        def durable(result: SaveResult) -> None:
            cost = self._ckpt.last_cost
            if cost is not None:
                d = self.interval.record(
                    blocking_s=cost.blocking_s, background_s=cost.background_s, marked=True
                )
                if d is not None:
                    self.decisions.append(d)
            prune(self.storage, self.prefix, self.policy, gc=True)

        self.interval.mark(step)
        fut = self._ckpt.save_async(
            self.path(step), state, meta={"step": step, **(meta or {})}, tags=tags,
            on_durable=durable,
        )
        if wait:
            fut.result()
        return fut

    def restore_latest(
        self, *, allow_fresh_start: bool = False, like: Any = None
    ) -> tuple[int, Any] | None:
        """(step, state) of the newest checkpoint that verifies; None if there is none yet.

        Bad checkpoints are skipped newest first (and quarantined unless
        ``quarantine_bad=False``), each with a warning naming the one used instead.
        If checkpoints exist but none verifies, this raises NoValidCheckpointError,
        because the usual ``restore_latest() or (0, init())`` would silently start
        over; pass ``allow_fresh_start=True`` to get None in that case.

        ``like``: a template state tree; the checkpoint that would be restored is
        compared with it from its manifest (keys, array shapes and dtypes: see
        :mod:`.like`) and a difference raises CheckpointMismatchError.
        """
        bad: list[tuple[CheckpointCorruptError, str]] = []
        found = None
        for step in reversed(self.steps()):
            path = self.path(step)
            try:
                if like is not None:  # a mismatch is not corruption: raised, never quarantined
                    check_like(read_manifest(self.storage, path), like, name=f"checkpoint {path}",
                               fix="restore without like= to get the state as saved, "
                                   "or save to a new prefix")
                found = step, load(self.storage, path, allow_pickle=self.allow_pickle).state
                break
            except CheckpointCorruptError as e:
                where = quarantine(self.storage, path, str(e)) if self.quarantine_bad else path
                bad.append((e, where))
        if found is not None:
            # The restored step is covered: the next due() fires at the next multiple.
            self.interval.mark(found[0])
        using = (f"using checkpoint {self.path(found[0])} of step {found[0]}" if found
                 else "no earlier checkpoint verifies")
        moved = "the bad one was moved to" if self.quarantine_bad else "the bad one stays at"
        for err, where in bad:
            warnings.warn(f"{err}; {using}; {moved} {where}", RuntimeWarning, stacklevel=2)
        if found is None and bad and not allow_fresh_start:
            raise NoValidCheckpointError(
                f"none of the {len(bad)} checkpoints under {self.prefix or 'the storage root'} "
                f"verifies ({'; '.join(f'{err.path}: {err.detail}' for err, _ in bad)}); "
                "repair them, or call restore_latest(allow_fresh_start=True) to start over"
            )
        return found

    def wait(self) -> None:
        self._ckpt.wait()

    def close(self) -> None:
        self._ckpt.close()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
