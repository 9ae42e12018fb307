"""Members of a step as Ray actors: a data step's sub-workers, a gang's ranks.

The :class:`~segue.executor.pool.SubWorkerPool` seam, on Ray. The attempt's worker
(the coordinator, itself in an actor: executor.ray) joins the cluster and
starts one :class:`~segue.executor.ray_member.MemberActor` per member, each
asking Ray for one member's resources; a gang's ranks are placed together as
one placement group (PACK: one node if it fits, several if not). Members dial
back to a listener of the coordinator with a secret key of this attempt and
then speak the same protocol as local sub-workers over their pipes (a
:class:`~segue.executor.doorman.Doorman` greets each in a thread of its own, so
a caller that connects and says nothing holds up no member). A data
step's sub-workers may already be up: the controller warmed them with the
attempt (executor.ray; their names come in the worker's options record,
segue.executor.ray_attempt), and the pool takes those by name.

A member is lost when its connection ends without its last word, or when
Ray reports its actor dead (a node lost without closing its sockets); the
attempt then fails as it does locally (``SubWorkerLost``) and is retried from
its last checkpoint. Every actor here is owned by the worker: if the worker
dies, Ray ends its members with it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from .doorman import Doorman
from .pool import ConnectionPool, SubWorkerLost
from .ray import connect, forwarded_env
from .ray_attempt import RayAttempt
from .ray_member import member_options
from .ray_node import drain_log, flow_bundle

log = logging.getLogger("segue.executor.ray")

PLACE_TIMEOUT_ENV = "SEGUE_RAY_PLACE_TIMEOUT_S"
PLACE_TIMEOUT_S = 600.0  # a member Ray cannot place in this long fails the attempt
PLACE_WARN_S = 10.0  # ... and after this long, the worker's log says what it waits for
LOG_EVERY_S = 0.5  # how often members' output is fetched into the worker's own
DRAIN_S = 5.0  # how long a leaving member's last output is waited for
# How often the coordinator asks Ray about its members: recv() runs for every few
# messages, and a ray.wait each time costs the data path its throughput.
CHECK_EVERY_S = 0.1


class RayProcessPool(ConnectionPool):
    """Members as Ray actors; ``resources``: one member's (flow.model.Resources)."""

    def __init__(self, noun: str, *, attempt: RayAttempt, resources: Any = None, gang: int = 0) -> None:
        super().__init__(noun)
        from .ray_member import MemberActor

        self._ray = connect(attempt.address)
        self._cls = self._ray.remote(MemberActor)
        self._key = secrets.token_bytes(32)
        self._flow = Path(attempt.flow_file or "")
        self._bundle = flow_bundle(self._flow) if self._flow.is_file() else {}
        self._opts = member_options(resources)
        self._place_timeout = float(os.environ.get(PLACE_TIMEOUT_ENV, PLACE_TIMEOUT_S))
        self._gang = gang
        # Warmed by the controller (index -> actor name), each taken once.
        self._warm = dict(enumerate(n for n in attempt.warm if n))
        self._warmed: set[int] = set()
        self._pg: Any = None
        self._actors: dict[int, Any] = {}
        self._refs: dict[int, Any] = {}
        self._recipes: dict[int, tuple[Any, float]] = {}  # not yet said hello: recipe, since
        self._outbox: dict[int, list[tuple[Any, ...]]] = {}  # sent to them before they said hello
        self._warned: set[int] = set()
        self._hellos: dict[int, tuple[Connection, str, int]] = {}  # said hello, not yet admitted
        self._rendezvous: tuple[str, int] | None = None  # a gang's: rank 0's node and port
        self._lock = threading.Lock()
        # Members' output, read back into this process's (the attempt's log), whole lines
        # only so that two members never mix within a line: index -> [offset, pending
        # read, partial line].
        self._outs: dict[int, list[Any]] = {}
        self._next_log = 0.0
        self._next_check = 0.0
        # Members dial in here; each proves the key and says hello in a thread of its own.
        self._door = Doorman(self._ray.util.get_node_ip_address(), self._key, self._on_hello)

    # -- members dialling in ------------------------------------------------------------
    def _on_hello(self, conn: Connection, hello: Any) -> None:
        if not (isinstance(hello, tuple) and len(hello) == 5 and hello[0] == "hello"):
            conn.close()
            return
        log.info("%s %d runs on Ray node %s%s", self._noun, hello[1], hello[4],
                 " (warmed with the attempt)" if hello[1] in self._warmed else "")
        with self._lock:
            self._hellos[int(hello[1])] = (conn, str(hello[2]), int(hello[3]))

    def _admit(self) -> None:
        """Hand each member that said hello its recipe (a gang's, once rank 0 is known)."""
        with self._lock:
            hellos, self._hellos = self._hellos, {}
        for i, (conn, node, port) in sorted(hellos.items()):
            if i not in self._recipes:  # removed meanwhile
                conn.close()
                continue
            if self._gang and self._rendezvous is None and i == 0:
                self._rendezvous = (node, port)
        waiting: dict[int, tuple[Connection, str, int]] = {}
        for i, (conn, node, port) in sorted(hellos.items()):
            if i not in self._recipes:
                continue
            recipe, _ = self._recipes[i]
            if self._gang:
                if self._rendezvous is None:
                    waiting[i] = (conn, node, port)
                    continue
                recipe = dataclasses.replace(recipe, master_addr=self._rendezvous[0],
                                             master_port=self._rendezvous[1])
            conn.send(("recipe", recipe, None))  # Ray chose the member's devices
            self._conns[i] = conn
            del self._recipes[i]
            for msg in self._outbox.pop(i, []):  # what the coordinator said meanwhile
                super().send(i, msg)
        if waiting:
            with self._lock:
                self._hellos.update(waiting)

    def _check_members(self) -> None:
        """Members Ray reports dead, or that ended or were never placed before dialling in."""
        now = time.monotonic()
        for i, (_, since) in list(self._recipes.items()):
            if now - since > PLACE_WARN_S and i not in self._warned:
                self._warned.add(i)
                log.warning("%s %d is not running on Ray after %.0fs: the cluster has no room for "
                            "%s now; it waits up to %gs ($%s)", self._noun, i, now - since,
                            self._describe(), self._place_timeout, PLACE_TIMEOUT_ENV)
            if now - since > self._place_timeout:
                raise SubWorkerLost(
                    f"{self._noun} {i} was not started on Ray within {self._place_timeout:g}s "
                    f"(asked for {self._describe()}); the cluster has no room for it now "
                    f"(${PLACE_TIMEOUT_ENV} sets the wait); the attempt is retried")
        refs = {id(r): i for i, r in self._refs.items()}
        if not refs:
            return
        ready, _ = self._ray.wait(list(self._refs.values()), num_returns=len(refs), timeout=0)
        for ref in ready:
            i = refs[id(ref)]
            try:
                code = self._ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - RayActorError and kin
                if i in self._leaving:
                    continue
                raise SubWorkerLost(f"{self._noun} {i} lost its Ray actor ({type(exc).__name__}); "
                                    "its node may be lost; the attempt is retried from the last "
                                    "checkpoint") from None
            if i not in self._conns and i not in self._leaving:
                raise self._lost(i, f"exited with code {code} before it reached the coordinator")

    def _describe(self) -> str:
        return ", ".join(f"{k}={v:g}" for k, v in self._opts.items() if k.startswith("num_")) or "nothing"

    # -- SubWorkerPool ---------------------------------------------------------------------
    def add(self, index: int, recipe: Any, devices: tuple[int, ...] | None) -> None:
        actor = self._take_warm(index)
        if actor is None:
            opts = dict(self._opts)
            if self._gang:
                opts["scheduling_strategy"] = self._placement(index)
            actor = self._cls.options(**opts).remote()
        self._recipes[index] = (recipe, time.monotonic())
        self._actors[index] = actor
        self._refs[index] = actor.run.remote(
            address=self._door.address, key=self._key, index=index, kind=self._noun,
            env=forwarded_env(), flow=self._bundle, flow_name=self._flow.name)

    def _take_warm(self, index: int) -> Any:
        """The actor the controller warmed for member ``index``, once; else None."""
        name = self._warm.pop(index, None)
        if name is None:
            return None
        try:
            actor = self._ray.get_actor(name, namespace="segue")
        except ValueError:  # gone meanwhile: this member starts cold
            return None
        self._warmed.add(index)
        return actor

    def _placement(self, index: int) -> Any:
        """A gang's ranks go together: one placement group, one bundle per rank."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._pg is None:
            bundle = {"CPU": self._opts.get("num_cpus", 0), "GPU": self._opts.get("num_gpus", 0)}
            bundle = {k: v for k, v in bundle.items() if v} or {"CPU": 0.01}
            self._pg = placement_group([bundle] * self._gang, strategy="PACK")
        return PlacementGroupSchedulingStrategy(placement_group=self._pg,
                                                placement_group_bundle_index=index)

    def send(self, index: int, message: tuple[Any, ...]) -> None:
        if index in self._recipes:  # not dialled in yet: it gets this once it has (in order)
            self._outbox.setdefault(index, []).append(message)
            return
        super().send(index, message)

    def recv(self, timeout: float) -> list[tuple[int, tuple[Any, ...]]]:
        self._admit()
        now = time.monotonic()
        if now >= self._next_check:  # (a lost member also reads as EOF on its connection)
            self._next_check = now + CHECK_EVERY_S
            self._pump_output()
            self._check_members()
        if not self._conns:
            time.sleep(min(timeout, 0.05))
            return []
        return super().recv(timeout)

    def _lost(self, i: int, why: str) -> SubWorkerLost:
        end = "its end unknown"
        ref = self._refs.get(i)
        if ref is not None:
            try:  # the member process's exit code, as its actor saw it
                end = f"exit code {self._ray.get(ref, timeout=2.0)}"
            except Exception as exc:  # noqa: BLE001 - a lost actor, or not ended yet
                end = f"its Ray actor {type(exc).__name__}"
        return SubWorkerLost(f"{self._noun} {i} (a Ray actor) {why} ({end}); the attempt is retried "
                             "from the last checkpoint")

    # -- members' output -----------------------------------------------------------------
    def _pump_output(self) -> None:
        now = time.monotonic()
        if now < self._next_log:
            return
        self._next_log = now + LOG_EVERY_S
        for i, actor in self._actors.items():
            out = self._outs.setdefault(i, [0, None, b""])
            if out[1] is not None:
                ready, _ = self._ray.wait([out[1]], timeout=0)
                if not ready:
                    continue
                self._took(out, self._get(out[1]))
            out[1] = actor.read_log.remote(out[0])

    def _get(self, ref: Any, timeout: float | None = None) -> bytes:
        try:
            return bytes(self._ray.get(ref, timeout=timeout))
        except Exception:  # noqa: BLE001 - a lost actor's output is lost with its node
            return b""

    def _took(self, out: list[Any], chunk: bytes) -> None:
        out[0] += len(chunk)
        whole, _, out[2] = (out[2] + chunk).rpartition(b"\n")
        if whole:
            _emit(whole + b"\n")

    def _drain_output(self, index: int) -> None:
        """The rest of a leaving member's output (its actor is still there)."""
        actor, out = self._actors.get(index), self._outs.pop(index, None)
        if actor is None:
            return
        out = out or [0, None, b""]
        with contextlib.suppress(Exception):  # a lost actor's output is lost with its node
            drain_log(self._ray, actor, out[0], out[1], DRAIN_S, lambda chunk: self._took(out, chunk))
        if out[2]:
            _emit(out[2] + b"\n")

    def remove(self, index: int) -> None:
        self._drain_output(index)
        conn = self._conns.pop(index, None)
        actor = self._actors.pop(index, None)
        self._refs.pop(index, None)
        self._recipes.pop(index, None)
        self._outbox.pop(index, None)
        self._leaving.discard(index)
        if conn is not None:
            conn.close()
        if actor is not None:
            with contextlib.suppress(Exception):
                self._ray.kill(actor)

    def stop(self) -> None:
        for c in self._conns.values():
            with contextlib.suppress(OSError, EOFError):
                c.send(("stop",))
        if self._refs:
            with contextlib.suppress(Exception):
                self._ray.wait(list(self._refs.values()), num_returns=len(self._refs), timeout=2.0)
        for i in list(self._actors):
            self.remove(i)
        self._door.close()  # no hello is handed over after this
        with self._lock:  # said hello, never admitted
            hellos, self._hellos = self._hellos, {}
        for conn, _, _ in hellos.values():
            conn.close()
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self._pg)
            self._pg = None


def _emit(data: bytes) -> None:
    """Into this process's output: the attempt's log, which `segue logs` shows."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
        os.write(2, data)
