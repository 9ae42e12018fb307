"""The object a step function receives: restore, checkpoint, pause points, progress.

Everything a step may do to committed state goes through here, and every
commit carries the attempt's epoch, so a zombie attempt is fenced off by the
store (invariant 2). The cheap checks (:meth:`StepContext.checkpoint_due`,
:attr:`StepContext.pause_requested`) read plain attributes only: they never
touch the disk or the database, so tight loops may call them every iteration.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .. import _faults
from .. import checkpoint as ckpt
from ..errors import CheckpointCorruptError, NoValidCheckpointError
from ..flow.model import StepSpec
from ..home import checkpoint_path
from ..states import Actor
from ..store.base import Store
from . import rng

log = logging.getLogger("segue.step")

DEFAULT_CHECKPOINT_EVERY_S = 30.0


class Park(BaseException):
    """Unwinds a step after it checkpointed on a pause request.

    A BaseException, so a step's ``except Exception`` cannot swallow it.
    """


@dataclass
class Flags:
    """Shared between the step thread, signal handlers and the heartbeat thread.

    Plain attributes: setting one is atomic under the GIL and safe in a handler.
    """

    pause_requested: bool = False
    fenced: bool = False
    progress: tuple[float, float | None] | None = None
    progress_dirty: bool = False


class _Inputs(Mapping[str, Any]):
    """Upstream outputs, loaded (and verified) on first access."""

    def __init__(self, names: tuple[str, ...], load: Callable[[str], Any]) -> None:
        self._names = names
        self._load = load
        self._cache: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(
                f"step has no upstream step {name!r}; declare it with after=[...] (upstream: {', '.join(self._names) or 'none'})"
            )
        if name not in self._cache:
            self._cache[name] = self._load(name)
        return self._cache[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


class StepContext:
    """Handed to every step function as its only argument."""

    def __init__(
        self,
        *,
        run_id: str,
        spec: StepSpec,
        params: Mapping[str, Any],
        epoch: int,
        attempt: int,
        store: Store,
        storage: ckpt.CheckpointStorage,
        flags: Flags,
        load_input: Callable[[str], Any],
        code_fingerprint: str,
    ) -> None:
        self.run_id = run_id
        self.step = spec.name
        self.spec = spec
        self.params = MappingProxyType(dict(params))
        self.epoch = epoch
        self.attempt = attempt
        self.inputs: Mapping[str, Any] = _Inputs(spec.after, load_input)
        self._store = store
        self._storage = storage
        self._flags = flags
        self._fingerprint = code_fingerprint
        self._every_s = spec.checkpoint_every_s
        self._every_steps = spec.checkpoint_every_steps
        if self._every_s is None and self._every_steps is None:
            self._every_s = DEFAULT_CHECKPOINT_EVERY_S
        self._last_ckpt_t = time.monotonic()
        self._cur_steps: int | None = None
        self._last_ckpt_steps: int | None = None
        self._next_seq = 1
        self._restored = False
        self.checkpoints_written = 0

    # -- cheap checks (no I/O) -----------------------------------------------
    @property
    def pause_requested(self) -> bool:
        """True once the operator (or the scheduler) asked this step to park."""
        return self._flags.pause_requested

    def checkpoint_due(self, steps: int | None = None) -> bool:
        """Whether the step should call :meth:`checkpoint` now.

        True when a pause was requested, or when the step's interval
        (``checkpoint_every`` seconds or ``checkpoint_every_steps``) has
        elapsed. ``steps`` is the step's own counter (iterations, records...).
        """
        if self._flags.pause_requested:
            return True
        if steps is not None:
            self._cur_steps = steps
            if self._every_steps is not None:
                if self._last_ckpt_steps is None:
                    self._last_ckpt_steps = steps
                elif steps - self._last_ckpt_steps >= self._every_steps:
                    return True
        return self._every_s is not None and time.monotonic() - self._last_ckpt_t >= self._every_s

    def progress(self, done: float, total: float | None = None) -> None:
        """Report progress; flushed to the store by the heartbeat, not here."""
        self._flags.progress = (float(done), None if total is None else float(total))
        self._flags.progress_dirty = True

    # -- state ---------------------------------------------------------------
    def restore(self) -> Any | None:
        """The step's latest committed state, or None on a first start.

        Also restores the global RNGs captured with that checkpoint. A
        checkpoint that fails verification is quarantined (with a warning
        event) and the previous one is tried; if every committed checkpoint is
        bad the step fails rather than silently starting fresh.
        """
        everything = self._store.list_checkpoints(
            self.run_id, self.step, statuses=("committed", "quarantined", "pruned")
        )
        if everything:
            self._next_seq = max(c.seq for c in everything) + 1
        committed = [c for c in everything if c.status == "committed"]
        self._restored = True
        bad: list[str] = []
        for rec in committed:  # newest first
            try:
                loaded = ckpt.load(self._storage, rec.path, allow_pickle=self.spec.allow_pickle)
            except CheckpointCorruptError as exc:
                bad.append(f"{rec.seq}: {exc.detail}")
                self._quarantine(rec.seq, rec.path, exc)
                continue
            payload = loaded.state
            rng.restore(payload.get("rng", {}))
            self._last_ckpt_t = time.monotonic()
            self._last_ckpt_steps = None
            return payload["state"]
        if committed:
            raise NoValidCheckpointError(
                f"step {self.step!r} of run {self.run_id!r}: none of its {len(committed)} committed "
                f"checkpoints verifies ({'; '.join(bad)}); they were moved to quarantine/ and the step "
                f"will not start from scratch on its own; `segue resume {self.run_id}` starts it over"
            )
        return None

    def _quarantine(self, seq: int, path: str, exc: CheckpointCorruptError) -> None:
        try:
            where = ckpt.quarantine(self._storage, path, str(exc))
        except FileNotFoundError:
            where = "(files missing)"
        self._store.set_checkpoint_status(
            self.run_id, self.step, seq, "quarantined", actor=Actor.WORKER, reason=str(exc)
        )
        self._store.append_event(
            self.run_id,
            "warning",
            actor=Actor.WORKER,
            step=self.step,
            reason=f"{exc}; using the previous checkpoint; the bad one was moved to {where}",
            data={"seq": seq, "path": path, "quarantine": where},
        )
        warnings.warn(f"{exc}; moved to {where}", RuntimeWarning, stacklevel=3)

    def checkpoint(self, state: Any, *, position: Any = None) -> None:
        """Commit ``state`` durably; then park if a pause was requested.

        Returns once the checkpoint's manifest is durable and the store has
        recorded it under this attempt's epoch. Raises FencedError if a newer
        attempt owns the step (this attempt must stop).
        """
        if not self._restored:
            # Without this, seq numbers could collide with committed ones.
            everything = self._store.list_checkpoints(
                self.run_id, self.step, statuses=("committed", "quarantined", "pruned")
            )
            self._next_seq = max((c.seq for c in everything), default=0) + 1
            self._restored = True
        _faults.fault_point("ctx.before_checkpoint")
        seq = self._next_seq
        path = checkpoint_path(self.run_id, self.step, seq, self.epoch)
        pos = position if position is not None else {"seq": seq, "steps": self._cur_steps}
        meta = {
            "run_id": self.run_id,
            "step": self.step,
            "seq": seq,
            "epoch": self.epoch,
            "position": pos,
            "code_fingerprint": self._fingerprint,
        }
        saved = ckpt.save(
            self._storage,
            path,
            {"state": state, "rng": rng.capture()},
            meta=meta,
            allow_pickle=self.spec.allow_pickle,
        )
        _faults.fault_point("ctx.after_save")
        self._store.commit_checkpoint(
            self.run_id, self.step, self.epoch, seq=seq, path=path, position=pos, nbytes=saved.nbytes
        )
        self._next_seq = seq + 1
        self.checkpoints_written += 1
        self._last_ckpt_t = time.monotonic()
        self._last_ckpt_steps = self._cur_steps
        if self._flags.progress is not None:
            done, total = self._flags.progress
            self._store.report_progress(self.run_id, self.step, self.epoch, done, total)
            self._flags.progress_dirty = False
        _faults.fault_point("ctx.after_commit")
        if self._flags.pause_requested:
            raise Park()
