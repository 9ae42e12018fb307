"""The coordinator of a parallel map step (``run_map(workers=N)``).

The step's own process coordinates N sub-workers (:mod:`segue.data.pool`).
It owns the shard queue and the assignments, and it is the only one that
commits. The engine sees one task, one attempt, one checkpoint stream.

Checkpoint barrier: every sub-worker stops at a unit boundary and stages its
sink; the coordinator commits ONE checkpoint naming the queue, every
assignment and position and every sub-worker's sink state; only then do the
sub-workers publish what they staged. A plain barrier does not hold the
sub-workers: each reads on past its ``staged`` message while the checkpoint
commits, and the coordinator takes its state at that message and defers what
it says after until the commit is done (a consistent cut; the later output
waits for the next checkpoint). Rebalancing happens at a barrier that holds:
a lagging shard is split at its position, the two halves of its remainder go
to the lagging and to an idle sub-worker, and that checkpoint commits the split.

Elastic steps (``workers=(min, max)``): the checkpoint has ``max`` slots, each
with its own sink scope; a slot is *live* while a sub-worker serves it. A
retired slot keeps its shard and position (vacant work), which the next idle
sub-worker takes over. Sub-workers are added when work waits and the pool
has devices (:class:`segue.data.elastic.Scaler`), and retired at a barrier:
they publish what the checkpoint covers and exit, then their devices go back.
"""

from __future__ import annotations

import logging
import pickle
from typing import Any

from .._park import Park
from ..executor.pool import SubWorkerLost, SubWorkerPool
from .driver import STATE_VERSION, STATS, Limits, MapRun, home_dir, store_of
from .elastic import Group, Scaler
from .pool import pool_for
from .sinks.base import Scope, Sink
from .sources.base import Shard, Source
from .subworker import Recipe

log = logging.getLogger("segue.data")


class _Slot:
    __slots__ = ("shard", "position")

    def __init__(self) -> None:
        self.shard: Shard | None = None
        self.position: Any = None

    def remaining(self) -> float:
        if self.shard is None:
            return 0.0
        n, _ = self.shard.size()
        return float("inf") if n is None else float(n - self.shard.done(self.position))


class ParallelMapRun(MapRun):
    """One attempt of a parallel data step. Build with :func:`segue.data.run_map`."""

    def __init__(self, ctx: Any, source: Source, op: Any, sink: Sink, dead: Sink, limits: Limits,
                 on_input_change: str, read_batch: int, *, workers: int, min_split: int | None,
                 recipe: Recipe | None, pool: SubWorkerPool | None = None,
                 allow_pickle: bool = False, min_workers: int | None = None,
                 scaler: Scaler | None = None) -> None:
        super().__init__(ctx, source, op, sink, dead, limits, on_input_change, read_batch)
        for s in (sink, dead):
            if not s.supports_workers:
                raise ValueError(f"{type(s).__name__} cannot be written by parallel sub-workers; "
                                 f"use workers=1 or a file sink (JsonlSink, ParquetSink)")
        self.n = workers
        self.min_split = min_split
        self.allow_pickle = allow_pickle
        self.recipe = recipe if recipe is not None else self._pickled_recipe()
        spec = getattr(ctx, "spec", None)  # a step's context (a stand-in may have none)
        self.pool = pool if pool is not None else pool_for(
            ctx, "sub-worker", resources=getattr(spec, "resources", None))
        self.slots = [_Slot() for _ in range(workers)]
        self.idle = [True] * workers
        self.splits = 0
        self._unsplittable: set[str] = set()  # shards whose split() said no: don't ask again
        low = workers if min_workers is None else min_workers
        self.scaler = scaler if scaler is not None else Scaler.for_attempt(ctx, low, workers)
        self.live: dict[int, Group | None] = {}  # slot -> the devices of its sub-worker
        self.starting: dict[int, Group | None] = {}  # started, not yet opened its sinks
        self._past_cut: list[tuple[int, tuple[Any, ...]]] = []  # said after a barrier's "staged"

    def _pickled_recipe(self) -> Recipe:
        if not self.allow_pickle:
            # No pickle unless the user opts in: the sub-workers would unpickle it.
            raise ValueError(
                f"run_map(workers={self.n}) called directly would send fn, source and sinks to the "
                f"sub-workers with pickle; pass allow_pickle=True to opt in, or declare the step with "
                f"@flow.map(..., workers={self.n})"
            )
        try:
            blob = pickle.dumps((self.source, self.op, self.sink, self.dead))
        except Exception as exc:  # noqa: BLE001 - pickling raises many types
            raise ValueError(
                f"run_map(workers={self.n}) sends fn, source and sinks to sub-worker processes, but they "
                f"do not pickle ({type(exc).__name__}: {exc}); use module-level functions and unopened "
                f"sinks, or declare the step with @flow.map(..., workers={self.n})"
            ) from None
        c = self.ctx
        return Recipe(c.run_id, c.step, c.epoch, self.read_batch, dict(c.params), pickled=blob,
                      home=home_dir(c), store=store_of(c))

    # -- recovery ---------------------------------------------------------------
    def _restore(self) -> dict[str, Any] | None:
        state = self.ctx.restore()
        if state is not None and (state.get("v") != STATE_VERSION or state.get("mode") != "parallel"
                                  or state.get("workers") != self.n):
            raise ValueError(f"step {self.ctx.step!r} was checkpointed with workers="
                             f"{state.get('workers', 1)}, not {self.n}; resume it with the same setting")
        now = self.source.snapshot()
        self.pin = now if state is None else self.source.pinned(state["pin"], now, self.policy, self.ctx.step)
        self.shards = self.source.shards(self.pin)
        sizes = [s.size() for s in self.shards]
        self.unit = sizes[0][1] if sizes else "records"
        self.total = None if any(n is None for n, _ in sizes) else sum(n or 0 for n, _ in sizes)
        if state is None:
            self.queue = [s.to_json() for s in self.shards]
            self.finished = 0.0
            self.sink_states: list[Any] = [None] * self.n
            self.dead_states: list[Any] = [None] * self.n
        else:
            # include-new appends the new inputs' shards after the pinned ones: they are
            # in no saved queue or slot yet, so they join the queue's end here.
            self.queue = list(state["queue"])
            if self.pin != state["pin"]:
                known = {s.key for s in self.source.shards(state["pin"])}
                self.queue += [s.to_json() for s in self.shards if s.key not in known]
            self.finished = float(state["finished"])
            self.splits = int(state["splits"])
            self.sink_states, self.dead_states = state["sinks"], state["dead"]
            for slot, saved in zip(self.slots, state["slots"], strict=True):
                if saved["shard"] is not None:
                    slot.shard = self.source.shard_from_json(saved["shard"])
                    slot.position = saved["position"]
            self.stats.update(state["stats"])
            self.stats["restarts"] += 1
        return state

    # -- the run ----------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        state = self._restore()
        if state is not None and state.get("done"):
            self._finish_committed()
            return self.summary()
        # Ownership refusals surface here as themselves (not retryable), not as a
        # lost sub-worker: each sub-worker's open() would refuse the same way.
        c = self.ctx
        self.sink.preflight(c.run_id, c.step)
        self.dead.preflight(c.run_id, c.step)
        try:
            # Slots holding restored work start first; the rest take over vacant work.
            order = sorted(range(self.n), key=lambda i: (self.slots[i].shard is None, i))
            first = dict(zip(order, self.scaler.initial_groups(), strict=False))
            for i, devices in first.items():
                self.pool.add(i, self.recipe, devices)
                self.pool.send(i, ("open", self.sink_states[i], self.dead_states[i]))
            self._await("opened", first)
            for i, devices in sorted(first.items()):
                self._went_live(i, devices)
            self._loop()
            for i in list(self.starting):  # not opened: nothing of theirs is committed
                self.starting.pop(i)
                self.pool.remove(i)
            self._check_read_all()
            self._barrier(done=True)
            for i in self.live:
                self.pool.send(i, ("finish",))
            self._await("finished", self.live)
            self._finish_vacant()
        finally:
            self.pool.stop()
        return self.summary()

    def _finish_committed(self, slots: Any = None) -> None:
        # The last checkpoint said done: roll its staged output forward, per sub-worker scope.
        c = self.ctx
        for i in range(self.n) if slots is None else slots:
            for s, st in ((self.sink, self.sink_states[i]), (self.dead, self.dead_states[i])):
                s.open(Scope(c.run_id, c.step, c.epoch, worker=i), st)
                s.finish()
                s.close()

    def _finish_vacant(self) -> None:
        """Slots without a sub-worker at the end (retired): finish their sinks here."""
        self._finish_committed([i for i in range(self.n) if i not in self.live
                                and (self.sink_states[i] is not None or self.dead_states[i] is not None)])

    def _went_live(self, i: int, devices: Group | None) -> None:
        self.live[i] = devices
        slot = self.slots[i]
        self.idle[i] = slot.shard is None
        if slot.shard is not None:
            self.pool.send(i, ("assign", slot.shard.to_json(), slot.position))

    def _vacant_work(self) -> list[int]:
        return [i for i in range(self.n) if i not in self.live and self.slots[i].shard is not None]

    def _loop(self) -> None:
        while True:
            for i, msg in self.pool.recv(0.05):
                self._on(i, msg)
            self._assign_idle()
            if all(self.idle[i] for i in self.live) and not self.queue and not self._vacant_work():
                return
            lagging = self._split_candidate()
            if lagging is not None or self.ctx.checkpoint_due(self.stats["records_in"]):
                self._barrier(split=lagging is not None)
            self.ctx.progress(self._done_units(), self.total)
            if self.scaler.elastic:
                self._scale()

    def _on(self, i: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "tick":
            _, pos, n_in, n_out, nbytes, fails, err = msg
            self.slots[i].position = pos
            st = self.stats
            st["records_in"] += n_in
            st["records_out"] += n_out
            st["bytes_in"] += nbytes
            self.attempt_records += n_in
            if fails:
                st["failures"] += fails
                self.last_error = err
                log.warning("step %s: %d record(s) failed in sub-worker %d (last: %s)", self.ctx.step,
                            fails, i, err)
                self._check_limits()  # counts over all sub-workers
        elif kind == "idle":
            slot = self.slots[i]
            if slot.shard is not None:
                self.finished += slot.shard.done(slot.position) if slot.position else 0
            slot.shard, slot.position = None, None
            self.idle[i] = True
        elif kind == "opened" and i in self.starting:
            self._went_live(i, self.starting.pop(i))
        elif kind not in ("published",):
            raise SubWorkerLost(f"sub-worker {i} sent an unexpected {kind!r}")

    def _await(self, kind: str, which: Any, *, cut: bool = False) -> dict[int, tuple[Any, ...]]:
        """The ``kind`` message of every member in ``which``; others are handled as they
        come, except, with ``cut``, what a member says after its own: that is kept for
        :meth:`_past_the_cut`, so the state stays as of the cut."""
        want = set(which)
        got: dict[int, tuple[Any, ...]] = {}
        while want:
            for i, msg in self.pool.recv(1.0):
                if cut and i in got:
                    self._past_cut.append((i, msg))
                elif msg[0] == kind and i in want:
                    got[i] = msg
                    want.discard(i)
                else:
                    self._on(i, msg)
        return got

    def _past_the_cut(self) -> None:
        """Handle, in order, what the members said after the last barrier's cut."""
        said, self._past_cut = self._past_cut, []
        for i, msg in said:
            self._on(i, msg)

    def _assign_idle(self) -> None:
        for i in sorted(self.live):
            if not self.idle[i]:
                continue
            vacant = self._vacant_work()
            if vacant:
                # Take over a retired sub-worker's shard where the last checkpoint left it.
                src = self.slots[vacant[0]]
                shard, pos = src.shard, src.position
                src.shard, src.position = None, None
                assert shard is not None  # _vacant_work lists slots holding a shard
                self.slots[i].shard, self.slots[i].position = shard, pos
                self.idle[i] = False
                self.pool.send(i, ("assign", shard.to_json(), pos))
            elif self.queue:
                shard = self.source.shard_from_json(self.queue.pop(0))
                self._give(i, shard)
                self.pool.send(i, ("assign", shard.to_json(), shard.start()))

    # -- elastic: growing and shrinking -----------------------------------------
    def _scale(self) -> None:
        revoked = self.scaler.revoked()
        gone = [i for i, devs in {**self.live, **self.starting}.items() if devs and revoked & set(devs)]
        if gone:
            self._retire(gone, "its devices were promised to a more urgent run (partial preemption)")
            return
        busy = sum(1 for i in self.live if not self.idle[i])
        waiting = len(self.queue) + len(self._vacant_work())
        if waiting > len(self.starting) and len(self.live) + len(self.starting) < self.n:
            self._grow(waiting)
        elif not waiting and not self.starting and len(self.live) > self.scaler.low and \
                self._split_candidate() is None and busy < len(self.live):
            idle = sorted((i for i in self.live if self.idle[i]), reverse=True)
            self._retire(idle[:len(self.live) - self.scaler.low], "it ran out of work")

    def _grow(self, waiting: int) -> None:
        devices = self.scaler.grow()
        if devices is None:
            return
        free = [i for i in range(self.n) if i not in self.live and i not in self.starting]
        # A slot holding vacant work resumes it itself: its sink scope is that slot's.
        i = min(free, key=lambda k: (self.slots[k].shard is None, k))
        self.pool.add(i, self.recipe, devices or None)
        self.pool.send(i, ("open", self.sink_states[i], self.dead_states[i]))
        self.starting[i] = devices or None
        self._scaled("up", [i], devices or (), f"{waiting} shard(s) waiting")

    def _retire(self, slots: list[int], why: str) -> None:
        """Stop the sub-workers of ``slots`` at a barrier and give their devices back."""
        running = [i for i in slots if i in self.live]
        devices = [d for i in slots for d in (self.live.get(i) or self.starting.get(i) or ())]
        if running:
            self._barrier(retire=running)  # they publish what it covers and exit
        for i in slots:
            # A starting one had not opened its sinks: nothing of it is committed.
            self.starting.pop(i, None)
            self.live.pop(i, None)
            self.pool.remove(i)
            self.idle[i] = True
        self.scaler.shrink(devices)
        self._scaled("down", slots, tuple(devices), why)

    def _scaled(self, way: str, slots: list[int], devices: tuple[int, ...], why: str) -> None:
        n = len(self.live) + len(self.starting)
        on = f" on devices {list(devices)}" if devices else ""
        msg = (f"scaled {way} to {n} sub-worker(s) of {self.scaler.low}..{self.n}: "
               f"sub-worker(s) {slots}{on} {'started' if way == 'up' else 'retired'}; {why}")
        log.info("step %s: %s", self.ctx.step, msg)
        key = "scale_ups" if way == "up" else "scale_downs"
        self.stats[key] = self.stats.get(key, 0) + 1
        record = getattr(self.ctx, "record_event", None)
        if record is not None:
            record("scale", msg, data={"direction": way, "workers": n, "slots": slots,
                                       "devices": list(devices)},
                   stats={key: 1})

    def _give(self, i: int, shard: Shard) -> None:
        self.slots[i].shard, self.slots[i].position = shard, shard.start()
        self.idle[i] = False

    def _threshold(self) -> float:
        if self.min_split is not None:
            return float(self.min_split)
        return float(1 << 20) if self.unit == "bytes" else float(4 * self.read_batch)

    def _split_candidate(self) -> int | None:
        if self.queue or self._vacant_work() or not any(self.idle[i] for i in self.live):
            return None
        cand = [i for i in self.live if self.slots[i].shard is not None
                and self.slots[i].shard.key not in self._unsplittable]  # type: ignore[union-attr]
        if not cand:
            return None
        best = max(cand, key=lambda i: self.slots[i].remaining())
        return best if self.slots[best].remaining() > self._threshold() else None

    # -- the barrier --------------------------------------------------------------
    def _barrier(self, split: bool = False, done: bool = False, retire: Any = ()) -> None:
        live = sorted(self.live)
        # Held: a barrier whose checkpoint moves work (the new assignments start from
        # the staged positions), and one a pause will park at (nothing more to do).
        hold = split or done or bool(retire) or bool(getattr(self.ctx, "pause_requested", False))
        for i in live:
            self.pool.send(i, ("barrier", hold))
        staged = self._await("staged", live, cut=True)
        for i, msg in staged.items():
            self.sink_states[i], self.dead_states[i] = msg[1], msg[2]
        moves: dict[int, Shard] = {}
        if split:
            moves = self._split()
        state = {
            "v": STATE_VERSION, "mode": "parallel", "workers": self.n, "pin": self.pin,
            "queue": list(self.queue), "finished": self.finished, "splits": self.splits,
            "slots": [{"shard": None if s.shard is None else s.shard.to_json(), "position": s.position}
                      for s in self.slots],
            "sinks": list(self.sink_states), "dead": list(self.dead_states),
            "stats": dict(self.stats), "done": done, "live": live,
        }
        done_units = self._done_units() if not done or self.total is None else float(self.total)
        self.ctx.progress(done_units, self.total)
        try:
            self.ctx.checkpoint(state, position=self._parallel_position(done_units), durable=True)
        except Park:
            # Committed: publish what it names, then unwind (execute stops the pool).
            self._past_the_cut()
            for i in live:
                self.pool.send(i, ("publish", None, None))
            self._await("published", live)
            raise
        self._past_the_cut()
        for i in live:
            s = moves.get(i)
            if i in retire:
                self.pool.leaving(i)
                self.pool.send(i, ("retire",))
            else:
                self.pool.send(i, ("publish", None, None) if s is None else
                               ("publish", s.to_json(), s.start()))
        if retire:
            self._await("published", retire)

    def _split(self) -> dict[int, Shard]:
        """Split lagging shards for idle sub-workers; returns the new assignments."""
        moves: dict[int, Shard] = {}
        for idle in [i for i in sorted(self.live) if self.idle[i]]:
            cand = [i for i in sorted(self.live) if not self.idle[i] and i not in moves
                    and self.slots[i].shard.key not in self._unsplittable]  # type: ignore[union-attr]
            if not cand:
                break
            lag = max(cand, key=lambda i: self.slots[i].remaining())
            slot = self.slots[lag]
            if slot.remaining() <= self._threshold() or slot.shard is None:
                break
            pieces = slot.shard.split(slot.position)
            if pieces is None:
                self._unsplittable.add(slot.shard.key)
                break
            # The lagging shard ends at its position: [start, p) is done.
            self.finished += slot.shard.done(slot.position)
            left, right = pieces
            log.info("step %s: split shard %s at %s: %s to sub-worker %d, %s to sub-worker %d",
                     self.ctx.step, slot.shard.key, slot.position, left.key, lag, right.key, idle)
            self._give(lag, left)
            self._give(idle, right)
            moves[lag], moves[idle] = left, right
            self.splits += 1
        return moves

    # -- progress ---------------------------------------------------------------
    def _done_units(self) -> float:
        return self.finished + sum(s.shard.done(s.position) for s in self.slots
                                   if s.shard is not None and s.position is not None)

    def _parallel_position(self, done: float) -> dict[str, Any]:
        pos = self._position(len(self.shards), done)
        pos.update({"workers": self.n, "live": len(self.live), "splits": self.splits,
                    "queued": len(self.queue),
                    "slots": [{"shard": None if s.shard is None else s.shard.key,
                               "done": None if s.shard is None else s.shard.done(s.position)}
                              for s in self.slots]})
        return pos


__all__ = ["STATS", "ParallelMapRun"]
