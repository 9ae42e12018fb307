"""A sub-worker of a parallel map step: reads its assigned shard, transforms, writes its own sink.

It owns nothing durable by itself: it stages and publishes only when the
coordinator says so (the barrier), under names unique to its index
(``Scope.worker``). It never commits: positions reach the checkpoint only
through the coordinator. Protocol (coordinator -> sub-worker, replies)::

    open SINK DEAD      -> opened              recover its own staged parts
    assign SHARD POS                           read SHARD from POS
                        <- tick POS IN OUT BYTES FAILS ERR   units done since the last
                                               tick (at most every TICK_S, at once
                                               after a failure, always before any
                                               other message)
                        <- idle                the shard is exhausted
    barrier HOLD        -> staged SINK DEAD    at the next unit boundary; then, if
                                               HOLD, wait for the decision, else
                                               read on while the coordinator commits
    publish [SHARD POS] -> published           after the commit: publish what the
                                               barrier staged; maybe a new shard
    retire              -> published, exit     after the commit (HOLD barriers only)
    finish              -> finished            the step is done
    stop                                       exit (the commit failed, or the end)

A barrier that moves work (a split, a retirement, the last one) holds: the
assignment it decides starts from the staged position. Any other barrier does
not, so the sub-workers keep both cores busy through the commit's fsyncs; the
coordinator takes each sub-worker's state at its ``staged`` message and defers
what it says after, so the checkpoint is still a consistent cut.
"""

from __future__ import annotations

import os
import pickle
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from .._procs import die_with_parent
from .driver import dead_rows, default_dead_letter, iter_units
from .sinks.base import Scope

TICK_S = 0.02
"""How often at most a sub-worker reports its progress: the coordinator reads each
tick in Python, and on two cores its time is the sub-workers' (one tick per unit
cost it ~8% of a core at 400k records/s)."""


@dataclass(frozen=True)
class Recipe:
    """How a sub-worker rebuilds (source, operator, sink, dead-letter sink).

    Either from the flow file (``flow_path`` + the step name: ``@flow.map``
    steps, whose functions cannot be pickled) or from ``pickled`` objects.
    """

    run_id: str
    step: str
    epoch: int
    read_batch: int
    params: dict[str, Any] = field(default_factory=dict)
    flow_path: str | None = None
    pickled: bytes | None = None
    home: str = ".segue"  # the run's home: where the default dead letters go
    # The home's store as the attempt was told it (None: the home's own choice); not in
    # the repr, a URL may hold a password.
    store: str | None = field(default=None, repr=False)

    def build(self) -> tuple[Any, Any, Any, Any]:
        if self.pickled is not None:
            source, op, sink, dead = pickle.loads(self.pickled)  # noqa: S301 - only with run_map(allow_pickle=True), from our own parent
        else:
            from ..flow import load_flow

            if self.flow_path is None:
                raise ValueError("a sub-worker recipe needs flow_path or pickled objects")
            spec = load_flow(self.flow_path).flow.steps[self.step]
            decl = getattr(spec.fn, "segue_map", None)
            if decl is None:
                raise ValueError(f"step {self.step!r} of {self.flow_path} is not a @flow.map step")
            source, op, sink, dead = decl.build(_RebuildContext(self))
        if dead is None:
            dead = default_dead_letter(self.home, self.run_id, self.step)
        return source, op, sink, dead


class _RebuildContext:
    """What a ``source=``/``sink=`` builder (and a model session) may use in a sub-worker:
    ids, params, and :meth:`record_event` (a model's loads are run events, as in the step's
    own process). ``attempt`` is the epoch: it too is 1 only for the step's first attempt."""

    def __init__(self, r: Recipe) -> None:
        self.run_id, self.step, self.epoch, self.attempt = r.run_id, r.step, r.epoch, r.epoch
        self.params = dict(r.params)
        self.home, self.store_url = r.home, r.store
        self._store: Any = None

    def record_event(self, kind: str, reason: str, *, data: Any = None, stats: Any = None) -> None:
        from ..home import Home
        from ..states import Actor

        if self._store is None:
            self._store = Home.resolve(self.home, store=self.store_url).open_store()
        self._store.append_event(self.run_id, kind, actor=Actor.WORKER, step=self.step, reason=reason,
                                 data=dict(data) if data is not None else None)
        if stats:
            self._store.add_stats(self.run_id, dict(stats))


class _SubWorker:
    def __init__(self, conn: Connection, parent_pid: int, index: int, recipe: Recipe) -> None:
        self.conn, self.parent_pid = conn, parent_pid
        self.source, self.op, self.sink, self.dead = recipe.build()
        self.read_batch = recipe.read_batch
        self.scope = Scope(recipe.run_id, recipe.step, recipe.epoch, worker=index)
        self.shard: Any = None
        self.position: Any = None
        self._tick = [0, 0, 0, 0]  # records in, out, bytes, failures since the last tick
        self._tick_error = ""  # the last failure's, since the last tick
        self._ticked = time.monotonic()

    def serve(self) -> None:
        while True:
            if self.shard is None:
                self._handle(self.conn.recv())
                continue
            switched = False
            for unit in iter_units(self.op, self.shard, self.position, self.read_batch):
                self._process(unit)
                if os.getppid() != self.parent_pid:
                    os._exit(3)
                while self.conn.poll():
                    switched = self._handle(self.conn.recv()) or switched
                if switched:
                    break
            if not switched:
                self.shard = None
                self._say(("idle",))

    def _process(self, unit: Any) -> None:
        shard, sink = self.shard, self.sink
        res = self.op.apply(unit.records, unit.has_bad, sink.needs_keys)
        if res.outputs:
            keys = None
            if sink.needs_keys and res.origins is not None:
                keys = [f"{shard.key}:{unit.first_ordinal + a}:{b}" for a, b in res.origins]
            sink.write(res.outputs, shard.key, keys)
        err = ""
        if res.failures:
            rows = dead_rows(shard, unit, res.failures)
            self.dead.write(rows, shard.key, [f"{shard.key}:{r['ordinal']}" for r in rows])
            err = res.failures[-1][2]
        self.position = unit.position
        t = self._tick
        t[0] += len(unit.records)
        t[1] += len(res.outputs)
        t[2] += unit.nbytes
        if res.failures:
            t[3] += len(res.failures)
            self._tick_error = err
        now = time.monotonic()
        if res.failures or now - self._ticked >= TICK_S:  # failures at once: limits count them
            self._flush_tick(now)

    def _flush_tick(self, now: float) -> None:
        t = self._tick
        if t[0] or t[3]:
            self.conn.send(("tick", self.position, t[0], t[1], t[2], t[3], self._tick_error))
            self._tick, self._tick_error = [0, 0, 0, 0], ""
        self._ticked = now

    def _say(self, message: tuple[Any, ...]) -> None:
        """Send ``message`` after the progress it follows: the coordinator's view of this
        sub-worker (the position a checkpoint records) is always up to date when it reads one."""
        self._flush_tick(time.monotonic())
        self.conn.send(message)

    def _assign(self, shard_json: dict[str, Any], position: Any) -> None:
        self._flush_tick(time.monotonic())  # a tick's position is in the shard it was read from
        self.shard = self.source.shard_from_json(shard_json)
        self.position = position if position is not None else self.shard.start()

    def _handle(self, msg: tuple[Any, ...]) -> bool:
        """Run one command; True when it replaced the shard being read."""
        cmd = msg[0]
        if cmd == "open":
            self.sink.open(self.scope, msg[1])
            self.dead.open(self.scope, msg[2])
            self.conn.send(("opened",))
        elif cmd == "assign":
            self._assign(msg[1], msg[2])
            return True
        elif cmd == "barrier":
            self.sink.stage()
            self.dead.stage()
            self._say(("staged", self.sink.state(), self.dead.state()))
            if msg[1]:  # a barrier that moves work: nothing else until the commit is decided
                return self._handle(self.conn.recv())
        elif cmd in ("publish", "retire"):
            self.sink.publish()
            self.dead.publish()
            self._say(("published",))
            if cmd == "retire":  # committed and published: give the devices back
                raise SystemExit(0)
            if msg[1] is not None:
                self._assign(msg[1], msg[2])
                return True
        elif cmd == "finish":
            self.sink.finish()
            self.dead.finish()
            self._say(("finished",))
        elif cmd == "stop":
            raise SystemExit(0)
        return False


def main(conn: Connection, parent_pid: int, index: int, recipe: Recipe,
         devices: tuple[int, ...] | None = None) -> None:
    """Entry point of a local sub-worker process; it sees only ``devices`` (if any)."""
    die_with_parent(parent_pid, 3)
    if devices:
        # Before anything imports a framework: CUDA reads it once, at initialisation.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in devices)
    worker = None
    try:
        worker = _SubWorker(conn, parent_pid, index, recipe)
        worker.serve()
    except SystemExit:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported to the coordinator, which fails the attempt
        try:
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
        except (OSError, EOFError):
            pass
    finally:
        if worker is not None:
            worker.op.close()  # a model gives its device back before the sub-worker exits
            worker.sink.close()
            worker.dead.close()
