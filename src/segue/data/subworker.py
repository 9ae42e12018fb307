"""A sub-worker of a parallel map step: reads its assigned shard, transforms, writes its own sink.

It owns nothing durable by itself: it stages and publishes only when the
coordinator says so (the barrier), under names unique to its index
(``Scope.worker``). It never commits: positions reach the checkpoint only
through the coordinator. Protocol (coordinator -> sub-worker, replies)::

    open SINK DEAD      -> opened              recover its own staged parts
    assign SHARD POS                           read SHARD from POS
                        <- tick POS IN OUT BYTES FAILS ERR   after every unit
                        <- idle                the shard is exhausted
    barrier             -> staged SINK DEAD    at the next unit boundary
    publish [SHARD POS] -> published           after the commit; maybe a new shard
    finish              -> finished            the step is done
    stop                                       exit
"""

from __future__ import annotations

import os
import pickle
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from ..run.procs import die_with_parent
from .driver import dead_rows, default_dead_letter, iter_units
from .sinks.base import Scope


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
        self.home = r.home
        self._store: Any = None

    def record_event(self, kind: str, reason: str, *, data: Any = None, stats: Any = None) -> None:
        from ..home import Home
        from ..states import Actor

        if self._store is None:
            self._store = Home.resolve(self.home).open_store()
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
                self.conn.send(("idle",))

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
        self.conn.send(("tick", unit.position, len(unit.records), len(res.outputs), unit.nbytes,
                        len(res.failures), err))

    def _assign(self, shard_json: dict[str, Any], position: Any) -> None:
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
            self.conn.send(("staged", self.sink.state(), self.dead.state()))
            reply = self.conn.recv()  # nothing else may happen until the commit is decided
            if reply[0] == "stop":
                raise SystemExit(0)
            self.sink.publish()
            self.dead.publish()
            self.conn.send(("published",))
            if reply[0] == "retire":  # committed and published: give the devices back
                raise SystemExit(0)
            if reply[1] is not None:
                self._assign(reply[1], reply[2])
                return True
        elif cmd == "finish":
            self.sink.finish()
            self.dead.finish()
            self.conn.send(("finished",))
        elif cmd == "stop":
            raise SystemExit(0)
        return False


def main(conn: Connection, parent_pid: int, index: int, recipe: Recipe,
         devices: tuple[int, ...] | None = None) -> None:
    """Entry point of a local sub-worker process; it sees only ``devices`` (if any)."""
    die_with_parent(parent_pid, 3)
    if devices:
        # Before anything imports a framework: CUDA reads it once, at initialisation.
        visible = ",".join(str(d) for d in devices)
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        os.environ["SEGUE_DEVICES"] = visible
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
