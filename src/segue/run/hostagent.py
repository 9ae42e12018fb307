"""`segue agent`: one long-lived process per host that keeps runs alive across host deaths.

The agent registers its host in the store (``Store.register_host``: name,
devices, capacity) and renews that lease on every tick (``--poll``, shorter
than half the lease). On every tick it also looks for runs that nothing
drives any more: RUNNING with a controller lease that expired on the store's
clock (the controller was SIGKILLed, its host died or froze). A controller of
this host whose process is gone is dead at once, lease or not. It claims such a run by taking the controller lease itself, at the
controller epoch it judged dead (``acquire_controller(expect_epoch=)``: one
transaction, so of several agents exactly one wins, and the others, or a
`segue resume` that came first, make the claim fail), then starts a
controller on its host that takes the claim over (``expect_epoch``: only if
nobody took the run since) and resumes it from its last checkpoints. A
PAUSING run whose controller is gone is not resumed: the agent finishes the
pause (``ops.settle_orphaned_pause``), as the operator asked.

On a cluster-wide pool, a run whose controller handed it over to another host
(it fits there; ``scheduler.agent``) waits in that host's line: only that
host's agent takes it, while its agent lives. Between polls the agent sleeps in
``Store.wait_for_change``: on PostgreSQL it wakes as soon as any run's event
commits (LISTEN/NOTIFY), so a handed-over run starts at once; the poll still
bounds the wait when notifications are lost.

The agent holds nothing that matters: killed, it loses only its lease, and
the controllers it started keep running (they are detached). Two agents of
the same host name are refused while the first one's lease lives.

A zombie is harmless by construction: the old controller's transitions are
fenced on the controller epoch, its workers' commits on their task epochs
(the new controller's attempts raise them), so everything the frozen host
tries after it thaws is refused and recorded as a ``fenced`` event.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .._procs import pid_alive
from ..errors import ControllerConflictError, FencedError, UnknownRunError
from ..home import Home
from ..hostname import use_host
from ..states import RunState
from ..store.base import RunRecord, Store
from ..store.hostpool import home_key, pool_path
from ..store.pools import open_pool
from . import ops
from .options import RunOptions

log = logging.getLogger("segue.agent")

AGENT_TTL_S = 10.0  # the host's lease in the store
POLL_S = 1.0  # how often it looks for runs without a controller
MIN_TICK_S = 0.1  # how often at most, when woken by the store's notifications


@dataclass
class HostAgent:
    home: Home
    store: Store
    host: str
    pool: str | None = None  # this host's device pool (None: $SEGUE_POOL's)
    ttl_s: float = AGENT_TTL_S
    poll_s: float = POLL_S
    info: dict[str, Any] = field(default_factory=dict)
    epoch: int = 0
    taken: list[str] = field(default_factory=list)  # runs this agent took over, in order
    _pool: Any = None  # opened at the first tick that needs it
    schedules: bool = True  # fire the store's schedules too (run.schedules)
    _firer: Any = None

    @property
    def actor(self) -> str:
        return f"agent:{self.host}"

    def register(self) -> int:
        """Register the host; every controller this agent starts is told its name."""
        use_host(self.host)  # this process's own judgements of "this host" (ops, recovery)
        old = next((h for h in self.store.list_hosts() if h.host == self.host), None)
        # The same host name is this machine: an agent whose pid is gone here is dead
        # now (restarted after a crash), whatever its lease says.
        dead = old is not None and old.alive(self.store.now()) and not pid_alive(old.pid)
        self.epoch = self.store.register_host(self.host, pid=os.getpid(), info=self.info, ttl_s=self.ttl_s,
                                              steal=dead)
        log.info("agent of host %s registered (agent epoch %d)", self.host, self.epoch)
        return self.epoch

    def serve(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set or another agent registers this host (FencedError)."""
        try:
            while not stop.is_set():
                started = time.monotonic()
                self.tick()
                # Woken early by a run's event (PostgreSQL's LISTEN/NOTIFY: a controller
                # let go of its run), at most every MIN_TICK_S; else every poll.
                self.store.wait_for_change(self.poll_s)
                stop.wait(max(0.0, MIN_TICK_S - (time.monotonic() - started)))
        finally:
            self.store.release_host(self.host, self.epoch)

    def tick(self) -> list[str]:
        """Renew the host's lease, then take over every run nothing drives. Returns
        the runs taken over in this tick."""
        self.store.renew_host(self.host, self.epoch, self.ttl_s)
        taken: list[str] = []
        at = self.store.now()
        moving: dict[str, str] | None = None
        for run in self.store.list_runs(states=(RunState.RUNNING, RunState.PAUSING)):
            if not self._orphaned(run, at):
                continue
            if run.state == RunState.PAUSING:
                ops.settle_orphaned_pause(self.store, run.run_id, actor=self.actor)
                continue
            if moving is None:
                moving = self._moving(at)
            target = moving.get(run.run_id)
            if target is not None and target != self.host:
                continue  # moving to a host whose agent is alive: that agent starts it
            if self._take_over(run, moved=target == self.host):
                taken.append(run.run_id)
        self.taken += taken
        if self.schedules:  # due slots of the store's schedules (run.schedules); fenced in the store
            if self._firer is None:
                from .schedules import ScheduleFirer

                self._firer = ScheduleFirer(self.home, self.store, host=self.host, pool=self.pool,
                                            actor=self.actor)
            self._firer.tick()
        return taken

    def _orphaned(self, run: RunRecord, at: float) -> bool:
        local = run.controller_host == self.host
        if run.controller_alive(at):
            # A controller of this host whose process is gone is dead now, lease or not.
            return local and not pid_alive(run.controller_pid)
        # A controller of this host whose lease lapsed but whose process lives is riding
        # out a store outage (run.outage); it renews again once the store answers.
        return not (local and pid_alive(run.controller_pid))

    def _moving(self, at: float) -> dict[str, str]:
        """Runs a controller handed over to another host (a cluster-wide pool): run id ->
        the live host whose line the run waits in. Empty for a host-wide pool."""
        if self._pool is None:
            self._pool = open_pool(self.pool or pool_path(self.home.root, store=self.home.store), store=self.store)
        if not getattr(self._pool, "cluster", False):
            return {}
        key = home_key(self.home.root, self.store)
        live = {h.host for h in self.store.list_hosts() if h.alive(at)}
        return {r.run_id: r.host for r in self._pool.list_requests()
                if r.home == key and r.host in live}

    def _take_over(self, run: RunRecord, *, moved: bool = False) -> bool:
        ttl = RunOptions.from_json(run.options).lease_ttl_s
        try:
            # Only at the epoch judged dead: if anyone took the run since (another agent,
            # a `segue resume`), the claim is refused in the same transaction.
            claim = self.store.acquire_controller(run.run_id, pid=os.getpid(), host=self.host, ttl_s=ttl,
                                                  expect_epoch=run.controller_epoch)
        except (ControllerConflictError, UnknownRunError):
            return False  # another agent (or a `segue resume`) was first
        who = (f"pid {run.controller_pid} on host {run.controller_host}" if run.controller_pid
               else "none recorded")
        why = ("the scheduler moved the run here" if moved else
               f"its controller ({who}) stopped renewing its lease")
        self.store.append_event(
            run.run_id, "agent", actor=self.actor,
            reason=f"taken over by the agent of host {self.host}: {why}; resuming from the last "
                   "checkpoints",
            data={"host": self.host, "claim_epoch": claim, "from_host": run.controller_host,
                  "from_pid": run.controller_pid, "lease_until": run.controller_lease_until,
                  "moved": moved},
        )
        ops.spawn_detached(self.home, run.run_id, pool=self.pool, claim=(claim, run.controller_host),
                           host=self.host)
        log.info("took over run %s from %s (claim epoch %d)", run.run_id, who, claim)
        return True


def serve_forever(agent: HostAgent, stop: threading.Event) -> int:
    """Run the agent until ``stop``; 0 when stopped, 3 when another agent took the host."""
    agent.register()
    try:
        agent.serve(stop)
    except FencedError as exc:
        log.error("%s", exc)
        return 3
    return 0

