"""The object a step function receives: restore, checkpoint, pause points, progress.

Everything a step may do to committed state goes through here, and every
commit carries the attempt's epoch, so a zombie attempt is fenced off by the
store (invariant 2). The cheap checks (:meth:`StepContext.checkpoint_due`,
:attr:`StepContext.pause_requested`) read plain attributes only: they never
touch the disk or the database, so tight loops may call them every iteration.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .. import _faults
from .. import checkpoint as ckpt
from .._park import Park as Park
from ..checkpoint import like as ckpt_like
from ..checkpoint import scratch as ckpt_scratch
from ..checkpoint.interval import IntervalPolicy
from ..errors import CheckpointCorruptError, FlowError, UsageError
from ..flow.model import StepSpec
from ..home import Home, checkpoint_path
from ..states import Actor
from ..store.base import Store
from . import rng
from .metrics import MetricsBuffer, TensorBoardExport, check_points
from .restart import no_valid_checkpoint, restart_floor
from .scratch import ScratchArea, base_dir

if TYPE_CHECKING:
    from ..data.elastic import Placement
    from ..executor.pool import SubWorkerPool

log = logging.getLogger("segue.step")

DEFAULT_CHECKPOINT_EVERY_S = 30.0


@dataclass
class Flags:
    """Shared between the step thread, signal handlers and the heartbeat thread.

    Plain attributes: setting one is atomic under the GIL and safe in a handler.
    """

    pause_requested: bool = False
    checkpoint_requested: bool = False  # "checkpoint now" from the operator (SIGUSR2)
    fenced: bool = False
    progress: tuple[float, float | None] | None = None
    progress_dirty: bool = False
    metrics: MetricsBuffer = field(default_factory=MetricsBuffer, repr=False, compare=False)
    _flush_lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def flush_progress(self, write: Callable[[float, float | None], None]) -> None:
        """Write the latest progress with ``write(done, total)`` if it changed since
        the last write; a failed write stays due. Every writer (the heartbeat, a
        checkpoint's commit, the attempt's end) goes through here, one at a time,
        each with the value current when it takes the lock: a slow writer can never
        land an older value over a newer one. The step thread only sets attributes."""
        with self._flush_lock:
            if not self.progress_dirty or self.progress is None:
                return  # the store holds the latest already
            self.progress_dirty = False  # before the read: a report after it stays due
            done, total = self.progress
            try:
                write(done, total)
            except BaseException:
                self.progress_dirty = True
                raise


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
    """Handed to every step function as its only argument.

    Where the task stands on a path chosen at run time (docs/flows.md): ``item`` and
    ``index`` in a fan-out's task, ``iteration`` and ``previous`` (the last iteration's
    output) in a loop's; a branch point calls :meth:`choose`.
    """

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
        previous_progress: tuple[float | None, float | None] | None = None,
        home: Home | None = None,
        options: Mapping[str, Any] | None = None,
        placement: Placement | None = None,
        pool_factory: Callable[..., SubWorkerPool] | None = None,
        task: str | None = None,
        path: Mapping[str, Any] | None = None,
    ) -> None:
        self.run_id = run_id
        # What the worker was told by its controller's record (run.worker_options), for
        # a data step's sub-workers: its allocation in the host pool, and where its
        # members run (beside it, or as Ray actors). segue.data takes them from here.
        self.placement = placement
        self.pool_factory = pool_factory
        # The run's home (where its default dead letters go) and its stored
        # options (RunOptions.to_json()): a step reads what the run was created
        # or resumed with, never the environment of whichever process started it.
        self.home = home
        self.options: Mapping[str, Any] = MappingProxyType(dict(options or {}))
        self.step = task or spec.name  # a fan-out's item or a loop's iteration: NAME.K
        self.spec = spec
        # Where this task is on the run's path (docs/flows.md): a fan-out's item and its
        # index, a loop's iteration and the output of the one before (None at first).
        where = dict(path or {})
        self.index: int | None = where.get("index")
        self.item: Any = where.get("item")
        self.iteration: int | None = where.get("iteration")
        self.previous: Any = where.get("previous")
        self.chosen: tuple[str, ...] | None = None
        self.params = MappingProxyType(dict(params))
        self.epoch = epoch
        self.attempt = attempt
        self.rank, self.world_size = 0, 1  # a gang step's ranks each have their own (run/gang.py)
        self.restored_seq: int | None = None  # the checkpoint restore_payload returned
        self.inputs: Mapping[str, Any] = _Inputs(spec.after, load_input)
        # The last progress the previous attempt reported: how far it got, which
        # may be past its last checkpoint (that difference is work done again).
        self.previous_progress = previous_progress
        self._store = store
        self._storage = storage
        self._flags = flags
        self._fingerprint = code_fingerprint
        # Called before each checkpoint's commit: the worker's record of what the step's
        # process imported (run.environment.ImportsRecorder), so a committed state has one.
        self.before_commit: Callable[[], None] | None = None
        every: str | float | None
        if spec.checkpoint_auto:
            every = "auto"
        elif spec.checkpoint_every_s is not None:
            every = spec.checkpoint_every_s
        elif spec.checkpoint_every_steps is not None:
            every = None
        else:
            every = DEFAULT_CHECKPOINT_EVERY_S
        self._interval = IntervalPolicy(every=every, every_steps=spec.checkpoint_every_steps,
                                        mtbf_s=spec.mtbf_s)
        if spec.checkpoint_auto:
            self._observe_history()
        self._writer = ckpt.Checkpointer(storage, max_in_flight=1, allow_pickle=spec.allow_pickle,
                                         on_error=self._on_background_error)
        if home is not None:  # beside the attempts' logs, on the host that runs the step
            flags.metrics.exporters.append(
                TensorBoardExport(home.root / "logs" / run_id / "tensorboard" / spec.name))
        self._recorded_cost: str | None = None
        self._cur_steps: int | None = None
        self._next_seq = 1
        self._restored = False
        self.checkpoints_written = 0
        # ctx.scratch (run/scratch.py): set up by prepare_scratch before the step runs,
        # which also restores the checkpoint that restore() then returns (kept here).
        self._scratch: ScratchArea | None = None
        self._early: tuple[Any, ckpt.Manifest | None] | None = None
        self._loaded_manifest: ckpt.Manifest | None = None

    def choose(self, *steps: str | Callable[..., Any]) -> None:
        """At a branch point (``@flow.step(choices=[...])``): run these of its choices;
        the others are SKIPPED. Recorded with the step's output, so a resume follows
        the path taken, whatever the step would decide now."""
        names = tuple(s if isinstance(s, str) else s.__name__ for s in steps)
        if not self.spec.choices:
            raise FlowError(f"step {self.spec.name!r} called ctx.choose but declares no choices; "
                            f"declare them with @flow.step(choices=[...])")
        unknown = [n for n in names if n not in self.spec.choices]
        if not names or unknown:
            raise FlowError(f"step {self.spec.name!r}: ctx.choose takes one or more of "
                            f"{list(self.spec.choices)}, not {list(names)}")
        self.chosen = tuple(dict.fromkeys(names))

    # -- cheap checks (no I/O) -----------------------------------------------
    @property
    def pause_requested(self) -> bool:
        """True once the operator (or the scheduler) asked this step to park."""
        return self._flags.pause_requested

    def checkpoint_due(self, steps: int | None = None) -> bool:
        """Whether the step should call :meth:`checkpoint` now.

        True when a pause or a checkpoint was requested, or when the step's
        interval (``checkpoint_every`` seconds, ``"auto"`` or
        ``checkpoint_every_steps``) has elapsed. ``steps`` is the step's own
        counter (iterations, records...); ``checkpoint_every_steps=N`` is due at
        steps N, 2N, ... (the step restored from counts as covered).
        """
        if self._flags.pause_requested or self._flags.checkpoint_requested:
            return True
        if steps is not None:
            self._cur_steps = steps
        return self._interval.due(steps)

    def request_checkpoint(self) -> None:
        """Make the next :meth:`checkpoint_due` true ("checkpoint now")."""
        self._interval.force()

    def progress(self, done: float, total: float | None = None) -> None:
        """Report progress; flushed to the store by the heartbeat, not here."""
        self._flags.progress = (float(done), None if total is None else float(total))
        self._flags.progress_dirty = True

    def flush_progress(self) -> None:
        """Write the latest :meth:`progress` to the store (fenced), if it changed."""
        self._flags.flush_progress(
            lambda done, total: self._store.report_progress(self.run_id, self.step, self.epoch, done, total))

    def log_metrics(self, step: int, **values: float) -> None:
        """Record ``values`` (``loss=..., lr=...``) at ``step``, the step's own counter.

        Buffered here, no I/O: the heartbeat writes them (one fenced write a second at
        most), and so do every checkpoint's commit (the points logged before
        :meth:`checkpoint` are stored before it is committed) and the attempt's end. A
        point is keyed by (name, step): a resumed attempt logging a step again replaces
        its point, never adds one. NaN and infinities are stored as null (a gap in the
        chart). Names are a letter or ``_`` then up to 63 letters, digits or ``_``;
        anything else, or a value that is not a number, is a ValueError.
        """
        if self.world_size > 1:
            raise UsageError("ctx.log_metrics is not supported in gang steps (world_size > 1) "
                             "yet; log from a step of one process")
        self._flags.metrics.add(check_points(step, values))

    def flush_metrics(self, *, final: bool = False) -> None:
        """Write the metrics logged since the last flush to the store (fenced); ``final``
        also closes the TensorBoard event file (the attempt's end)."""
        self._flags.metrics.flush(
            lambda points: self._store.put_metrics(self.run_id, self.step, points, epoch=self.epoch))
        if final:
            self._flags.metrics.close()

    @property
    def reported_progress(self) -> tuple[float, float | None] | None:
        """The last :meth:`progress` reported, as (done, total)."""
        return self._flags.progress

    def record_event(self, kind: str, reason: str, *, data: Mapping[str, Any] | None = None,
                     stats: Mapping[str, float] | None = None) -> None:
        """Append an event of ``kind`` for this step to the run's history, and add
        ``stats`` to the run's counters (what `segue status` accounts). Not fenced:
        an event says what happened, even in an attempt that is superseded later."""
        self._store.append_event(self.run_id, kind, actor=Actor.WORKER, step=self.step, reason=reason,
                                 data=dict(data) if data is not None else None)
        add = getattr(self._store, "add_stats", None)
        if stats and add is not None:
            add(self.run_id, dict(stats))

    # -- state ---------------------------------------------------------------
    def restore(self, *, like: Any = None) -> Any | None:
        """The step's latest committed state, or None on a first start.

        Also restores the global RNGs captured with that checkpoint. A
        checkpoint that fails verification is quarantined (with a warning
        event) and the previous one is tried; if every committed checkpoint is
        bad the step fails rather than silently starting fresh.

        ``like``: a template state tree (``{"model": model.state_dict(), ...}``).
        The checkpoint's keys, and its arrays' shapes and dtypes, are compared with
        it from the manifest, before any tensor is read; a difference raises
        CheckpointMismatchError naming the first ones (not retried: see
        checkpoint/like.py for what matches).
        """
        payload = self.restore_payload(like=like)
        if payload is None:
            return None
        rng.restore(payload.get("rng", {}))
        return payload["state"]

    def restore_payload(self, check: Callable[[Any], None] | None = None, *,
                        like: Any = None) -> Any | None:
        """The newest committed checkpoint's whole payload that verifies (and passes
        ``check``, which raises CheckpointCorruptError to reject it), or None on a first
        start; the bad ones are quarantined as :meth:`restore` says. A ``like`` template
        is checked against its state (:meth:`restore`) before its arrays are read."""
        early, self._early = self._early, None
        if early is not None and check is None:  # restored by prepare_scratch already
            if like is not None and early[1] is not None:
                self._check_like(str(self.restored_seq), early[1], like)
            return early[0]
        everything = self._store.list_checkpoints(
            self.run_id, self.step, statuses=("committed", "quarantined", "pruned")
        )
        if everything:
            self._next_seq = max(c.seq for c in everything) + 1
        # Every checkpoint committed since the last --restart-step, whatever its
        # status now: a step that ever committed must never start from scratch
        # by itself, even after all of them were quarantined (or pruned).
        floor = restart_floor(self._store, self.run_id, self.step)
        history = [c for c in everything if c.seq > floor]
        committed = [c for c in history if c.status == "committed"]
        self._restored = True
        bad: list[tuple[int, str, CheckpointCorruptError, str]] = []
        for rec in committed:  # newest first
            try:
                if like is not None:  # a mismatch is not corruption: it raises, never quarantines
                    self._check_like(str(rec.seq), ckpt.read_manifest(self._storage, rec.path), like)
                loaded = ckpt.load(self._storage, rec.path, allow_pickle=self.spec.allow_pickle)
                if check is not None:
                    check(loaded.state)
                if self._scratch is not None:  # its files come from this same checkpoint
                    self._scratch.restore(self._storage, rec.seq, rec.path, loaded.manifest)
            except CheckpointCorruptError as exc:
                bad.append((rec.seq, rec.path, exc, self._quarantine(rec.seq, rec.path, exc)))
                continue
            self._warn_bad(bad, f"using checkpoint {rec.seq} at {rec.path}", rec.seq, rec.path)
            self._interval.mark(None)
            self.restored_seq = rec.seq
            self._loaded_manifest = loaded.manifest
            return loaded.state
        if committed:
            self._warn_bad(bad, "no earlier checkpoint verifies", None, None)
        if history:
            details = "; ".join(f"{seq}: {exc.detail}" for seq, _, exc, _ in bad)
            raise no_valid_checkpoint(self.run_id, self.step, len(history),
                                      details or "all were quarantined earlier")
        return None

    def _check_like(self, which: str, manifest: ckpt.Manifest, like: Any) -> None:
        tree = manifest.tree
        node = tree.get("state") if isinstance(tree, dict) else tree
        ckpt_like.check(
            manifest, like, node=node, name=f"checkpoint {which} of step {self.step!r}",
            fix=(f"restore without like= to get the state as saved, or start the step over "
                 f"with `segue resume {self.run_id} --restart-step {self.step}`"))

    def _quarantine(self, seq: int, path: str, exc: CheckpointCorruptError) -> str:
        """Move a bad checkpoint aside and mark it quarantined; returns where it went."""
        try:
            where = ckpt.quarantine(self._storage, path, str(exc))
        except FileNotFoundError:
            where = "(nowhere: its files are missing)"
        self._store.set_checkpoint_status(
            self.run_id, self.step, seq, "quarantined", actor=Actor.WORKER, reason=str(exc)
        )
        return where

    def _warn_bad(self, bad: list[tuple[int, str, CheckpointCorruptError, str]], using: str,
                  used_seq: int | None, used_path: str | None) -> None:
        """One warning event per bad checkpoint, naming the checkpoint used instead."""
        for seq, path, exc, where in bad:
            reason = (f"checkpoint {seq} of step {self.step!r} failed verification "
                      f"({exc.detail}); {using}; the bad one was moved to {where}")
            self._store.append_event(
                self.run_id, "warning", actor=Actor.WORKER, step=self.step, reason=reason,
                data={"seq": seq, "path": path, "quarantine": where,
                      "used_seq": used_seq, "used_path": used_path},
            )
            warnings.warn(reason, RuntimeWarning, stacklevel=3)

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False,
                   replicated: bool = False) -> None:
        """Commit ``state``; then park if a pause was requested.

        Blocks only while the state is copied into host buffers; the write
        happens in the background, and the store records the checkpoint
        (fenced by this attempt's epoch) only once its manifest is durable. A
        background failure is raised here at the next call. On a pause request
        it waits for the write, then parks the step.

        ``durable=True`` returns only once the checkpoint is committed (raising
        its failure, if any). A step that publishes side effects covered by the
        checkpoint (an exactly-once sink's two-phase commit) must use it, so it
        never publishes ahead of the commit.

        ``replicated`` matters to gang steps only (every rank holds the same state,
        as with DDP: see run/gang.py); a step of one process ignores it.
        """
        del replicated  # one process: its state is whole either way
        _faults.fault_point("ctx.before_checkpoint")
        t0 = time.perf_counter()  # the commit event records the save's duration (for /metrics)
        self._record_cost()
        seq, path = self.claim_seq()
        pos = position if position is not None else {"seq": seq, "steps": self._cur_steps}
        meta = {
            "run_id": self.run_id,
            "step": self.step,
            "seq": seq,
            "epoch": self.epoch,
            "position": pos,
            "code_fingerprint": self._fingerprint,
        }
        # ctx.scratch's files as they are now (copied: writes after this call cannot
        # reach the checkpoint); over its declared size, nothing is written.
        snap = self._scratch.snapshot(seq) if self._scratch is not None else None
        if snap is not None:
            meta[ckpt_scratch.META_KEY] = snap.listing

        def on_durable(saved: ckpt.SaveResult) -> None:
            # Runs in the writer's thread once the manifest is durable.
            _faults.fault_point("ctx.after_save")
            self.commit(seq, path, pos, nbytes=saved.nbytes + self._manifest_size(path),
                        duration_s=time.perf_counter() - t0)

        files = snap.plans if snap is not None else []
        try:
            if durable or self._flags.pause_requested:
                # Committed on return (a pause too waits for it): written in line, nothing staged.
                self._writer.save(path, {"state": state, "rng": rng.capture()}, meta=meta,
                                  on_durable=on_durable, blobs=files)
                if snap is not None:
                    snap.discard()
            else:
                fut = self._writer.save_async(path, {"state": state, "rng": rng.capture()}, meta=meta,
                                              on_durable=on_durable, blobs=files)
                if snap is not None:  # its copies are read until the save has ended
                    fut.add_done_callback(lambda _: snap.discard())
        except BaseException:
            if snap is not None:
                snap.discard()
            raise
        self.saved(self._cur_steps)
        if self._flags.pause_requested:
            raise Park()

    def close(self) -> None:
        """Wait for the save in flight (raising its failure, if any) and stop the writer."""
        self._writer.close()

    # -- ctx.scratch (run/scratch.py) -------------------------------------------------
    @property
    def scratch(self) -> Path:
        """This attempt's local directory, whose files are saved with every checkpoint
        (up to the step's ``scratch=`` size) and put back before the next attempt runs
        the step: those of the checkpoint :meth:`restore` returns."""
        if self.spec.scratch is None:
            gang = " (and gang steps, world_size > 1, have none)" if self.world_size > 1 else ""
            raise UsageError(f"step {self.spec.name!r} declares no scratch directory{gang}; declare "
                             f"its size with @flow.step(scratch=\"2GB\") to use ctx.scratch")
        if self._scratch is None:
            self.prepare_scratch()
        assert self._scratch is not None
        return self._scratch.path

    def prepare_scratch(self) -> None:
        """Before the step function runs (the worker calls it): make ``ctx.scratch``
        empty, restore the step's checkpoint and put its files there. :meth:`restore`
        then returns that checkpoint's state without reading it again. Nothing for a
        step without ``scratch=``."""
        if self.spec.scratch is None or self._scratch is not None:
            return
        area = ScratchArea(base_dir(self.home, self.run_id, self.step), self.epoch, self.spec.scratch,
                           task=self.step)
        area.open()
        self._scratch = area
        state = self.restore_payload()
        self._early = (state, self._loaded_manifest)

    def drop_scratch(self) -> None:
        """The attempt ended: remove its scratch directory (its checkpoints hold the files)."""
        if self._scratch is not None:
            self._scratch.drop()

    # -- the commit protocol's parts (a gang's coordinator uses them too) -------------
    def claim_seq(self) -> tuple[int, str]:
        """The next checkpoint's sequence number and path, never one in the store already."""
        if not self._restored:
            # Without this, seq numbers could collide with committed ones.
            everything = self._store.list_checkpoints(
                self.run_id, self.step, statuses=("committed", "quarantined", "pruned")
            )
            self._next_seq = max((c.seq for c in everything), default=0) + 1
            self._restored = True
        seq = self._next_seq
        self._next_seq = seq + 1
        return seq, checkpoint_path(self.run_id, self.step, seq, self.epoch)

    def saved(self, steps: int | None) -> None:
        """A checkpoint was taken at ``steps``: the interval starts over."""
        self.checkpoints_written += 1
        self._interval.mark(steps)
        self._flags.checkpoint_requested = False

    def commit(self, seq: int, path: str, position: Any, *, nbytes: int, duration_s: float,
               prune: bool = True) -> None:
        """Record checkpoint ``seq`` (durable at ``path``) in the store, fenced by this
        attempt's epoch: the commit point. Then flush the step's progress (the latest,
        never the one reported when the save began: that may be older than what the
        heartbeat wrote meanwhile), and prune past the retention, unless the caller
        calls :meth:`apply_retention` itself later (a gang, once its ranks go on)."""
        if self.before_commit is not None:
            self.before_commit()
        # First too: the commit's event records the progress the store holds (the UI's chart).
        self.flush_progress()
        self.flush_metrics()  # the points logged before the checkpoint are durable with it
        self._store.commit_checkpoint(
            self.run_id, self.step, self.epoch, seq=seq, path=path, position=position,
            nbytes=nbytes, duration_s=round(duration_s, 6),
        )
        self.flush_progress()
        _faults.fault_point("ctx.after_commit")
        if prune:
            self.apply_retention()

    # -- internals -----------------------------------------------------------
    def _manifest_size(self, path: str) -> int:
        try:
            return self._storage.size(f"{path}/MANIFEST.json")
        except OSError:
            return 0

    def _record_cost(self) -> None:
        cost = self._writer.last_cost
        if cost is None or cost.path == self._recorded_cost:
            return
        self._recorded_cost = cost.path
        decision = self._interval.record(blocking_s=cost.blocking_s, background_s=cost.background_s,
                                         marked=True)
        if decision is not None:
            self._store.append_event(self.run_id, "checkpoint-interval", actor=Actor.WORKER,
                                     step=self.step, reason=decision.reason, data=decision.as_event())

    def _observe_history(self) -> None:
        """Feed the run's own failure history to the "auto" interval."""
        stats: dict[str, float] = getattr(self._store, "get_stats", lambda r: {})(self.run_id)
        uptime = float(stats.get(f"step:{self.step}:s", 0.0))
        # The failure detector writes task transitions and failure records only.
        failures = sum(1 for e in self._store.list_events(self.run_id, kinds=("task", "failure"))
                       if e.step == self.step and e.actor == Actor.FAILURE_DETECTOR.value)
        if uptime > 0 and failures:
            self._interval.observe_failures(uptime, failures)
        d = self._interval.decision
        self._store.append_event(self.run_id, "checkpoint-interval", actor=Actor.WORKER, step=self.step,
                                 reason=d.reason, data=d.as_event())

    def _on_background_error(self, path: str, exc: BaseException) -> None:
        try:
            self._store.append_event(
                self.run_id, "warning", actor=Actor.WORKER, step=self.step,
                reason=f"checkpoint {path} could not be saved ({type(exc).__name__}: {exc}); "
                       "the step fails at its next checkpoint call and retries from the last one",
                data={"path": path},
            )
        except Exception:  # noqa: S110 - the failure itself is re-raised to the step
            pass

    def apply_retention(self) -> None:
        """Keep the newest ``keep_checkpoints`` committed checkpoints; prune older ones.

        The store marks one pruned before its files go, so a restore never
        picks a checkpoint that is being deleted. Shared blobs are left to GC.
        """
        keep = self.spec.keep_checkpoints
        for c in self._store.list_checkpoints(self.run_id, self.step)[keep:]:
            self._store.set_checkpoint_status(self.run_id, self.step, c.seq, "pruned",
                                              actor=Actor.WORKER,
                                              reason=f"retention: keep the last {keep}")
            try:
                self._storage.remove_tree(c.path)
            except OSError:
                pass
