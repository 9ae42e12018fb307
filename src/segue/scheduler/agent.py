"""The scheduling half of a controller: place attempts in the host pool,
preempt lower-priority runs, wait for capacity after being preempted, account.

Every decision is an event with its reason. The pool is shared by every home
on the machine (:mod:`segue.store.hostpool`); this run's own state (attempts,
epochs, statistics, events) stays in its home's store. Another home's store is
never written: a preemptor posts a preemption request in the pool and the
victim's own controller pauses its run, with its own controller epoch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from .._procs import pid_alive
from ..errors import FencedError, IllegalTransitionError, SegueError
from ..executor.base import PoolHost
from ..flow.model import StepSpec
from ..placement.policy import (
    Device,
    Holder,
    Need,
    choose_victims,
    effective_priority,
    place,
    priority_name,
    step_need,
    wait_reason,
)
from ..states import Actor, RunState, TaskState
from ..store.base import TaskRecord
from ..store.hostpool import kinds, never_fits, shared_part
from ..store.pool import Allocated, Denied, HostPoolStore, Placement
from .accounting import attempt_deltas, mean_rates, rates_of
from .devices import ensure_cluster_host, ensure_host

log = logging.getLogger("segue.scheduler")

REFRESH_S = 0.5  # how often a waiting request is re-announced (it has a lease)
MIN_PREEMPT_TTL_S = 5.0  # how long a preemption request waits for the victim's controller
# How long a run moving to another host keeps its place in that host's queue: its
# agent starts a controller there within a poll, which announces the run itself.
MOVE_HOLD_S = 30.0

# The home store as the scheduler uses it (SQLiteStore or PostgresStore): the Store contract plus
# run statistics, the local view of waiting requests and start_placed_attempt.
SchedStore = Any


@dataclass
class RunScheduler:
    store: SchedStore  # this run's home store
    pool: HostPoolStore  # the host pool, shared by every home
    home: str  # this run's home (its resolved path): runs are (home, run_id) in the pool
    run_id: str
    steps: dict[str, StepSpec]
    host: str
    priority: int
    preemptible: bool
    max_pause_s: float
    lease_ttl_s: float
    gpus_override: int = -1
    gpu_memory_override: int = 0
    spawn: Callable[[str, str], object] | None = None  # starts a detached controller (home, run)
    # The store this process was given explicitly (segue --store), which applies to every
    # home it opens, as $SEGUE_STORE does (segue.store.store_url); None: each home's own.
    store_url: str | None = None
    # The executor places attempts on a cluster of its own (Ray): ``host`` is that
    # cluster's entry in the pool (Executor.pool_host), whose GPUs runs queue for and
    # preempt one another for; the executor places cpus and memory itself.
    cluster_host: PoolHost | None = None
    # The controller's own host: ``host`` as given. With ``cluster_host``, ``host`` then
    # becomes the cluster's key in the pool (where this run's devices are).
    machine: str = field(init=False, default="")
    # (home, run) -> the preemption request posted to it
    victims: dict[tuple[str, str], int] = field(default_factory=dict)
    # (home, run) -> (devices promised by a partial preemption, when asked)
    _partial: dict[tuple[str, str], tuple[set[int], float]] = field(default_factory=dict)
    unsatisfiable: str | None = None  # set when a step can never fit on this host
    # A cluster-wide pool (a PostgreSQL store): may the run go on on another host? Only
    # when its checkpoints and outputs are where every host reads them, or it has none.
    shared_storage: bool = False
    move_to: tuple[str, str] | None = None  # (host, why): the run goes on there (see try_place)
    moved: bool = False  # handed over: close() keeps the request that holds its place there
    _target: str | None = None  # the host whose runs were preempted for us (None: this one)
    _hosts: list[str] = field(default_factory=list)  # _other_hosts, as last looked at
    _hosts_at: float = 0.0
    _announced: dict[str, float] = field(default_factory=dict)
    _reasons: dict[str, str] = field(default_factory=dict)
    _preempt_t0: float = 0.0
    _aged_to: int = 0
    _next_renew: float = 0.0

    def __post_init__(self) -> None:
        self.machine = self.host
        if self.cluster_host is not None:
            self.host = self.cluster_host.host
            ensure_cluster_host(self.pool, self.cluster_host)
        else:
            ensure_host(self.pool, self.host)
        self._aged_to = self.priority

    # -- needs -----------------------------------------------------------------
    def need(self, step: str) -> Need:
        need = step_need(self.steps, step, self.gpus_override, self.gpu_memory_override)
        if self.cluster_host is not None:  # whole GPUs; the cluster places cpus and memory
            return Need(gpus=need.gpus, accelerator=need.accelerator, per_worker=need.per_worker)
        return need

    def effective_priority(self) -> int:
        waited = self.waited_s()
        eff = effective_priority(self.priority, waited, self.max_pause_s)
        if eff > self._aged_to:
            self._aged_to = eff
            self.store.append_event(
                self.run_id, "scheduler", actor=Actor.SCHEDULER,
                reason=f"aging: priority raised to {priority_name(eff)} after {waited:.0f}s paused "
                       f"(max_pause {self.max_pause_s:g}s)",
                data={"priority": eff, "waited_s": waited},
            )
        return eff

    def _label(self, home: str, run_id: str) -> str:
        return run_id if home == self.home else f"{run_id} of home {home}"

    # -- placing ---------------------------------------------------------------
    def try_place(self, step: str, *, actor: str) -> Placement | None:
        """Start ``step`` on devices of this host, or say why not. On a cluster-wide
        pool the answer may be ``move_to``: the step fits (or was made room for) on
        another host, and the controller hands the run over to that host's agent."""
        need = self.need(step)
        prio = self.effective_priority()
        self.move_to = None
        if self.victims and not self._victims_parked():
            # Keep our request alive: it is what stops the victims (and anyone
            # else) from taking the capacity back while it frees.
            self._announce(step, need, prio, Denied(self._reasons.get(step) or
                                                    "waiting for preempted runs to park"))
            return None
        if self.victims and self._target not in (None, self.host):
            target = cast(str, self._target)
            freed = ", ".join(sorted(self._label(*v) for v in self.victims))
            self._move(target, step, need, prio, f"preempted {freed} there for step {step!r}")
            return None
        res = self.pool.allocate(self.home, self.run_id, step, host=self.host, need=need,
                                 priority=prio, preemptible=self.preemptible, ttl_s=self.lease_ttl_s)
        if isinstance(res, Denied):
            if self._fits_elsewhere(step, need, prio, res):
                return None
            if res.never and not self._could_fit_elsewhere(need):
                self.unsatisfiable = f"step {step!r} {res.reason}"
                return None
            self._announce(step, need, prio, res)
            if not self.victims:
                self._maybe_preempt(step, need, prio, on_this_host=not res.never)
            return None
        task = self._start(step, res, actor)
        if task is None:
            return None
        if self.victims:
            self.store.append_event(
                self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
                reason=f"placed on devices {list(res.devices)} {time.time() - self._preempt_t0:.2f}s "
                       f"after preempting {', '.join(sorted(self._label(*v) for v in self.victims))}",
                data={"devices": list(res.devices), "victims": sorted(r for _, r in self.victims)},
            )
            self.victims.clear()
        self._target = None
        self._announced.pop(step, None)
        self._reasons.pop(step, None)
        return Placement(task, res.devices)

    def _start(self, step: str, alloc: Allocated, actor: str) -> TaskRecord | None:
        """Start the attempt in the home store for an allocation the pool just made."""
        try:
            task = self.store.start_placed_attempt(
                self.run_id, step, ttl_s=self.lease_ttl_s, actor=actor,
                data={"devices": list(alloc.devices), "host": self.host})
        except BaseException:
            self.pool.release_id(alloc.id)  # nothing started: give the devices back now
            raise
        if self.pool.bind(alloc.id, task.epoch, self.lease_ttl_s):
            return task
        # The allocation's lease ran out between the two transactions (a stalled
        # process): the devices may belong to someone else now, so this attempt
        # must not run. It goes back to PENDING and is placed again.
        self.store.transition_task(
            self.run_id, step, TaskState.PENDING, actor=Actor.SCHEDULER, epoch=task.epoch,
            reason="its device allocation lapsed before the attempt started; placing it again")
        return None

    def _announce(self, step: str, need: Need, prio: int, denied: Denied) -> None:
        now = time.monotonic()
        changed = self._reasons.get(step) != denied.reason
        if changed:
            self.store.append_event(self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
                                    reason=denied.reason, data={"need": need.describe()})
        if changed or now - self._announced.get(step, 0) > REFRESH_S:
            # Waiting for runs preempted on another host: wait in that host's line.
            host = self._target or self.host
            self.pool.upsert_request(self.home, self.run_id, step, host=host, need=need,
                                     priority=prio, reason=denied.reason, ttl_s=self.lease_ttl_s)
            # The home's own view, for `segue status` and `segue ls`.
            self.store.upsert_request(self.run_id, step, host=host, need=need, priority=prio,
                                      reason=denied.reason, ttl_s=self.lease_ttl_s)
            self._announced[step] = now
            self._reasons[step] = denied.reason

    def _victims_parked(self) -> bool:
        """Have the victims let go of their devices? Forget them if one refused."""
        allocs = self.pool.list_allocations(self._target or self.host)
        holding = {(a.home, a.run_id) for a in allocs}
        waiting = False
        for victim, req_id in self.victims.items():
            if victim not in holding:
                continue
            promised = self._partial.get(victim)
            if promised is not None:
                devices, since = promised
                still = {d for a in allocs if (a.home, a.run_id) == victim for d in a.devices}
                if not devices & still:
                    continue  # given back; the rest of that run keeps its devices
                if time.monotonic() - since > max(self.lease_ttl_s, MIN_PREEMPT_TTL_S) * 2:
                    # It never gave them back (its step cannot shrink now): choose again;
                    # promised devices are no spare candidates, so the run pauses whole.
                    log.info("partial preemption of %s not honoured; choosing again", victim)
                    self._forget_victims()
                    return True
            req = self.pool.preemption(req_id)
            if req is None or req.outcome is not None and req.outcome != "accepted" or (
                    req.outcome is None and req.lease_until <= time.time()):
                # Refused (it stopped running meanwhile), or its controller never
                # answered: choose again from what holds the host now.
                log.info("preemption of %s not accepted (%s); choosing again", victim,
                         req.outcome if req else "gone")
                self._forget_victims()
                return True
            waiting = True
        if not waiting:
            self._partial.clear()
        return not waiting

    def _forget_victims(self) -> None:
        self.victims.clear()
        self._partial.clear()
        self._target = None

    def holders(self, host: str | None = None) -> list[Holder]:
        """What holds devices of ``host`` (default: this one), as preemption candidates."""
        host = host or self.host
        hp = self.pool.get_host(host)
        mem = {d.index: d.memory for d in hp.devices} if hp else {}
        kind = kinds(hp) if hp else {}
        now = time.time()
        by_run: dict[tuple[str, str], list] = {}
        for a in self.pool.list_allocations(host):
            if (a.home, a.run_id) != (self.home, self.run_id):
                by_run.setdefault((a.home, a.run_id), []).append(a)
        out = []
        for (home, rid), allocs in by_run.items():
            lost = sum(max(0.0, now - max(a.since, a.ckpt_at or a.since)) for a in allocs)
            mine = home == self.home  # another home's cpus and memory are not ours to free
            out.append(Holder(
                run_id=rid, home=home, priority=min(a.priority for a in allocs),
                preemptible=all(a.preemptible for a in allocs),
                devices=tuple(Device(i, mem.get(i, 0), kind=kind.get(i, "")) for a in allocs
                              if a.gpu_memory is None for i in a.devices),
                # A sharer's release frees its bytes on each device, not the device.
                shares=tuple((i, a.gpu_memory) for a in allocs if a.gpu_memory is not None
                             for i in a.devices),
                cpus=sum(a.cpus for a in allocs) if mine else 0.0,
                memory=sum(a.memory for a in allocs) if mine else 0,
                work_lost_s=lost, preemptions=max(a.preemptions for a in allocs),
                steps=tuple(a.step for a in allocs),
            ))
            # An elastic step's spare sub-workers: their devices go back at its next
            # barrier while the run keeps running (nothing is lost).
            for a in allocs:
                for group in a.surplus_groups():
                    out.append(Holder(
                        run_id=rid, home=home, priority=a.priority, preemptible=a.preemptible,
                        devices=tuple(Device(i, mem.get(i, 0), kind=kind.get(i, ""))
                                      for i in group if a.gpu_memory is None),
                        shares=tuple((i, a.gpu_memory) for i in group if a.gpu_memory is not None),
                        cpus=0.0, memory=0, work_lost_s=0.0, preemptions=a.preemptions,
                        steps=(a.step,), partial=a.step))
        return out

    def _maybe_preempt(self, step: str, need: Need, prio: int, *, on_this_host: bool = True) -> None:
        """Ask the cheapest set of lower-priority runs to free ``need``: on this host
        (``on_this_host``: the step can fit here), or on another host of a cluster-wide pool
        when that takes fewer runs; the run then moves there (:meth:`try_place`)."""
        best: tuple[tuple[int, bool], str, list[Holder]] | None = None
        for host in ([self.host] if on_this_host else []) + self._other_hosts():
            free = self.pool.free_capacity(host, self.home)
            if place(need, free) is not None:
                return  # it fits there; we are only waiting for our turn
            found = choose_victims(need, free, self.holders(host), prio) or []
            rank = (len(found), host != self.host)
            if found and (best is None or rank < best[0]):
                best = (rank, host, found)
        if best is None:
            return
        _, target, victims = best
        self._target = None if target == self.host else target
        t = time.time()
        seen: set[tuple[str, str]] = set()
        here = "" if not victims or all(v.home == self.home for v in victims) \
            else f" of home {self.home}"
        partial: dict[tuple[str, str], list[int]] = {}
        for v in victims:
            if v.partial is not None:
                partial.setdefault(v.run, []).extend(
                    [d.index for d in v.devices] + [i for i, _ in v.shares])
        for v in victims:
            if v.partial is not None and v.run in self.victims:
                continue  # one request per run names all its devices
            devices = partial.get(v.run) if v.partial is not None else None
            what = f"devices {devices} of step {v.partial!r} (its other sub-workers keep " \
                   f"running)" if devices is not None else need.describe()
            req = self.pool.request_preemption(
                v.home, v.run_id, by_home=self.home, by_run=self.run_id,
                reason=f"preempted by run {self.run_id!r} ({priority_name(prio)}){here} to free "
                       f"{what} for step {step!r}",
                ttl_s=max(self.lease_ttl_s, MIN_PREEMPT_TTL_S), devices=devices)
            self.victims[v.run] = req.id
            if devices is not None:
                self._partial[v.run] = (set(devices), time.monotonic())
        self._preempt_t0 = t
        said: list[str] = []
        for v in victims:
            if v.partial is None:
                said.append(f"{self._label(v.home, v.run_id)} ({priority_name(v.priority)}, "
                            f"{v.work_lost_s:.1f}s since its last checkpoint, preempted "
                            f"{v.preemptions}x before)")
            elif v.run not in seen:
                seen.add(v.run)
                said.append(f"devices {partial[v.run]} of {self._label(v.home, v.run_id)} step "
                            f"{v.partial!r} ({priority_name(v.priority)}; partial: it keeps running)")
        why = "; ".join(said) + ("" if target == self.host else f" on host {target}")
        self.store.append_event(
            self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
            reason=f"preempting {why}: lowest priority first, spare sub-workers before whole runs, "
                   f"then least work lost, then least preempted",
            data={"victims": list(dict.fromkeys(v.run_id for v in victims)),
                  "homes": list(dict.fromkeys(v.home for v in victims)),
                  "need": need.describe(), "host": target},
        )

    # -- other hosts (a cluster-wide pool) ------------------------------------------
    def _other_hosts(self) -> list[str]:
        """Hosts this run may move to: on a cluster-wide pool, those whose agent is
        alive (it starts the run's controller there), when the run's state can move."""
        if not self.pool.cluster or self.cluster_host is not None:
            return []  # (a Ray run's host is its cluster, wherever its controller runs)
        t = time.monotonic()
        if t >= self._hosts_at:  # a waiting run asks every tick: look again twice a second
            at = self.store.now()
            self._hosts = [] if not self._movable() else [
                h.host for h in self.store.list_hosts() if h.alive(at) and h.host != self.host]
            self._hosts_at = t + REFRESH_S
        return self._hosts

    def _movable(self) -> bool:
        if self.shared_storage:
            return True
        # Local checkpoints and outputs stay on this host: only a run with none may move.
        done = any(t.state == TaskState.SUCCEEDED for t in self.store.get_tasks(self.run_id))
        return not done and not self.store.list_checkpoints(self.run_id)

    def _fits_elsewhere(self, step: str, need: Need, prio: int, denied: Denied) -> bool:
        """Move the run to another host where ``need`` fits now (nobody better waits there)."""
        if not need.gpus:
            return False  # CPU steps run where their controller runs
        for host in self._other_hosts():
            hp = self.pool.get_host(host)
            if hp is None or never_fits(need, hp) is not None:
                continue
            free = self.pool.free_capacity(host, self.home)
            if place(need, free) is None or self._behind(host, need, prio, free, time.time()):
                continue
            self._move(host, step, need, prio, f"step {step!r} needs {need.describe()}, free "
                                               f"on host {host} (here: {denied.reason})")
            return True
        return False

    def _could_fit_elsewhere(self, need: Need) -> bool:
        for host in self._other_hosts():
            hp = self.pool.get_host(host)
            if hp is not None and never_fits(need, hp) is None:
                return True
        return False

    def _move(self, host: str, step: str, need: Need, prio: int, why: str) -> None:
        """Hold the run's place in ``host``'s line and ask the controller to hand over."""
        self.pool.upsert_request(self.home, self.run_id, step, host=host, need=need, priority=prio,
                                 reason=f"moving here from host {self.host}",
                                 ttl_s=max(MOVE_HOLD_S, 3 * self.lease_ttl_s))
        self.move_to = (host, why)

    def _behind(self, host: str, need: Need, prio: int, free: Any, since: float) -> Any:
        """The waiting request on ``host`` that goes before ours (placement's rule:
        never ahead of a higher class; FIFO within one), or None."""
        hp = self.pool.get_host(host)
        for r in self.pool.list_requests(host):
            if (r.home, r.run_id) == (self.home, self.run_id) or (
                    never_fits(r.need, hp) is not None if hp else r.need.gpus > 0):
                continue  # ourselves, or a request that can never run here (as allocate skips)
            if r.home != self.home and not (r.need.gpus and need.gpus):
                continue  # homes compete for devices only
            if r.priority > prio or (r.priority == prio and r.submitted_at < since and place(
                    shared_part(r.need, r.home != self.home), free) is not None):
                return r
        return None

    # -- every controller tick ---------------------------------------------------
    def tick(self, controller_epoch: int, attempts: Mapping[str, int]) -> bool:
        """Answer preemption requests, renew our allocations; True if the run's state changed.

        ``attempts``: step -> epoch of the attempts whose processes this
        controller still tracks. Their allocations live as long as the
        controller renews them; workers die with their controller, so a crashed
        controller's devices return when the lease runs out.
        """
        changed = self._answer_preemptions(controller_epoch)
        now = time.monotonic()
        if attempts and now >= self._next_renew:
            self._next_renew = now + self.lease_ttl_s / 4
            stats = self.store.get_stats(self.run_id)
            for step, epoch in attempts.items():
                cks = self.store.list_checkpoints(self.run_id, step)
                if not self.pool.renew(self.home, self.run_id, step, epoch, ttl_s=self.lease_ttl_s,
                                       ckpt_at=cks[0].created_at if cks else None,
                                       preemptions=int(stats.get("preemptions", 0))):
                    log.warning("the allocation of %s epoch %d lapsed before it was renewed "
                                "(this controller stalled for longer than its lease)", step, epoch)
        return changed

    def _answer_preemptions(self, controller_epoch: int) -> bool:
        reqs = self.pool.pending_preemptions(self.home, self.run_id)
        if not reqs:
            return False
        changed = False
        for r in reqs:
            run = self.store.get_run(self.run_id)
            if r.devices is not None and run.state == RunState.RUNNING:
                self._give_back(r)
                continue
            if run.state == RunState.PAUSING:
                self.pool.answer_preemption(r.id, "accepted")  # already parking: the devices free
                continue
            if run.state != RunState.RUNNING:
                self.pool.answer_preemption(r.id, f"refused: the run is {run.state.value}")
                continue
            try:
                self.store.transition_run(self.run_id, RunState.PAUSING, actor=Actor.SCHEDULER,
                                          only_from=(RunState.RUNNING,), reason=r.reason,
                                          controller_epoch=controller_epoch)
            except FencedError:
                return changed  # a newer controller owns the run; it answers
            except IllegalTransitionError as exc:
                self.pool.answer_preemption(r.id, f"refused: {exc}")
                continue
            self.store.add_stats(self.run_id, {"preemptions": 1})
            self.store.set_stats(self.run_id, {"preempted_at": time.time()})
            self.pool.park(self.home, self.run_id)
            self.pool.answer_preemption(r.id, "accepted")
            changed = True
        return changed

    def _give_back(self, r: Any) -> None:
        """A partial preemption: promise the devices; the step's coordinator stops the
        sub-workers on them at its next barrier and shrinks the allocation."""
        devices = list(r.devices or ())
        if not self.pool.revoke(self.home, self.run_id, devices):
            self.pool.answer_preemption(r.id, "refused: no elastic step of the run holds "
                                              f"devices {devices} now")
            return
        self.store.append_event(
            self.run_id, "scheduler", actor=Actor.SCHEDULER,
            reason=f"giving back devices {devices}: {r.reason}; the run keeps running on the rest",
            data={"devices": devices, "by_run": r.by_run, "partial": True})
        self.store.add_stats(self.run_id, {"preemptions_partial": 1})
        self.pool.answer_preemption(r.id, "accepted")

    def close(self) -> None:
        """The controller stops: nothing of this run waits any more (unless it moved:
        its request holds its place on the other host until a controller there runs)."""
        if self.moved:
            return
        self.pool.drop_requests(self.home, self.run_id)
        self.store.drop_request(self.run_id)

    # -- after an attempt -----------------------------------------------------
    def released(self, step: str, epoch: int, *, started_wall: float, outcome: str,
                 ended: float | None = None) -> tuple[float, float]:
        """Return the attempt's resources and account for it; (seconds held, seconds lost).

        ``outcome``: "done" | "parked" | "killed" (lost work since the last checkpoint).
        ``ended``: when it ended, if not now (an attempt lost with its controller ended
        at its last heartbeat).
        """
        alloc = self.pool.release(self.home, self.run_id, step, epoch)
        end = time.time() if ended is None else ended
        dur = max(0.0, end - started_wall)
        lost = 0.0
        if outcome == "killed":
            cks = [c for c in self.store.list_checkpoints(self.run_id, step) if c.epoch == epoch]
            lost = max(0.0, end - (cks[0].created_at if cks else started_wall))
        host = self.pool.get_host(alloc.host) if alloc else None
        if alloc is not None and alloc.parent is not None:
            # Resized while it ran (an elastic step): what it held on average.
            rates = mean_rates(self.pool.allocation_history(alloc.id), host, end)
        else:
            rates = rates_of(alloc, host)
        add, put = attempt_deltas(self.store.get_stats(self.run_id), step, epoch, rates, dur=dur,
                                  lost=lost, interrupted=outcome in ("killed", "parked"))
        # Set before add: a crash in between loses a credit rather than counting it twice.
        self.store.set_stats(self.run_id, put)
        self.store.add_stats(self.run_id, add)
        if alloc is not None and (alloc.devices or alloc.cpus):
            self.wake_orphans()
        return dur, min(lost, dur)

    def lost(self, step: str, epoch: int, *, started: float, last_alive: float) -> None:
        """Account for an attempt that died with its controller, as a killed one: from its
        recorded start to its last heartbeat, the part after its last checkpoint redone."""
        held, lost = self.released(step, epoch, started_wall=started, outcome="killed",
                                   ended=max(started, last_alive))
        self.store.append_event(
            self.run_id, "accounting", actor=Actor.SCHEDULER, step=step,
            reason=(f"attempt epoch {epoch} lost with its controller: charged {held:.1f}s, from its "
                    f"start to its last heartbeat, {lost:.1f}s of it redone"),
            data={"epoch": epoch, "start": started, "end": max(started, last_alive),
                  "held_s": round(held, 3), "lost_s": round(lost, 3)})

    # -- being preempted --------------------------------------------------------
    def preempted(self) -> bool:
        return self.store.get_stats(self.run_id).get("preempted_at", 0.0) > 0

    def waited_s(self) -> float:
        at = self.store.get_stats(self.run_id).get("preempted_at", 0.0)
        return time.time() - at if at > 0 else 0.0

    def _next_step(self, tasks: list[TaskRecord], order: list[str]) -> str | None:
        """The first step, in priority order, that would run next once the run resumes."""
        done = {t.step for t in tasks if t.state == TaskState.SUCCEEDED}
        states = {t.step: t.state for t in tasks}
        return next((s for s in order if states[s] in (TaskState.PARKED, TaskState.PENDING,
                                                       TaskState.RETRYING)
                     and all(u in done for u in self.steps[s].after)), None)

    def never_fits_next(self, tasks: list[TaskRecord], order: list[str]) -> str | None:
        """While PAUSED by preemption: why the next step can no longer ever run on this
        host (the pool shrank under the waiting run), or None."""
        nxt = self._next_step(tasks, order)
        hp = self.pool.get_host(self.host) if nxt is not None else None
        why = never_fits(self.need(nxt), hp) if nxt is not None and hp is not None else None
        return None if why is None else f"step {nxt!r} {why}"

    def capacity_back(self, tasks: list[TaskRecord], order: list[str]) -> bool:
        """While PAUSED by preemption: is there room again for the next task, in priority order?"""
        nxt = self._next_step(tasks, order)
        if nxt is None:
            return True
        need = self.need(nxt)
        prio = self.effective_priority()
        free = self.pool.free_capacity(self.host, self.home)
        if place(need, free) is None:
            # e.g. "preempted; waiting for 40 GiB on 1 gpu (best free: 16 GiB on gpu 0)"
            self._announce(nxt, need, prio, Denied(f"preempted; {wait_reason(need, free)}"))
            return False
        # The same rule as placement: never ahead of a waiting higher class.
        r = self._behind(self.host, need, prio, free, time.time() - self.waited_s())
        if r is not None:
            self._announce(nxt, need, prio, Denied(
                f"preempted; waiting behind run {r.run_id!r}"
                f"{'' if r.home == self.home else f' of home {r.home}'}"))
            return False
        return True

    def resumed_after_preemption(self) -> float:
        """Clear the preemption mark; returns how long the run waited."""
        waited = self.waited_s()
        self.store.set_stats(self.run_id, {"preempted_at": 0.0})
        self.store.add_stats(self.run_id, {"preempted_wait_s": waited})
        self.pool.unpark(self.home, self.run_id)
        return waited

    def wake_orphans(self) -> None:
        """Preempted runs whose controller is gone would wait forever: start one for each.

        The pool remembers every run paused by preemption, in any home. A home
        this user cannot open belongs to someone else; their own controllers
        wake it.
        """
        if self.spawn is None:
            return
        now = time.time()
        for home, rid in self.pool.parked():
            if (home, rid) == (self.home, self.run_id):
                continue
            store = self.store if home == self.home else _open_home_store(home, self.store_url)
            if store is None:
                if not Path(home).exists():
                    self.pool.unpark(home, rid)  # the home was deleted
                continue
            try:
                run = store.get_run(rid)
                waiting = store.get_stats(rid).get("preempted_at", 0.0) > 0
            except SegueError:
                self.pool.unpark(home, rid)  # the run is gone
                continue
            if run.state != RunState.PAUSED or not waiting:
                self.pool.unpark(home, rid)  # resumed, cancelled, or paused by its operator
                continue
            if run.controller_lease_until is not None and run.controller_lease_until > now and (
                run.controller_host != self.machine or pid_alive(run.controller_pid)
            ):
                continue  # its own controller is alive and waiting
            log.info("starting a controller for preempted run %s of home %s", rid, home)
            store.append_event(rid, "scheduler", actor=Actor.SCHEDULER,
                               reason=f"capacity freed by run {self.run_id!r}"
                                      f"{'' if home == self.home else f' of home {self.home}'}"
                                      "; starting a controller to resume this preempted run")
            self.spawn(home, rid)


def _open_home_store(home: str, explicit: str | None = None) -> Any:
    """Another home's store, or None if it is gone or not ours to open. The backend is
    chosen as for any home (segue.store.open_store; ``explicit``: a store given to this
    process), and nothing is created there."""
    from ..store import open_store

    try:
        return open_store(home, explicit, create=False)
    except (OSError, SegueError) as exc:
        if Path(home).exists():
            log.info("cannot open home %s: %s", home, exc)
        return None
