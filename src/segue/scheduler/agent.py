"""The scheduling half of a controller: place attempts in the shared pool,
preempt lower-priority runs, wait for capacity after being preempted, account.

Every decision is an event with its reason. The pool itself lives in the
store, so runs started from different processes share it and nothing is ever
allocated twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import IllegalTransitionError
from ..flow.model import StepSpec
from ..run.procs import pid_alive
from ..states import Actor, RunState, TaskState
from ..store.base import Store, TaskRecord
from ..store.pool import Denied, Placement, PoolStore
from .devices import ensure_host
from .policy import (
    Device,
    Holder,
    Need,
    choose_victims,
    effective_priority,
    place,
    priority_name,
)

log = logging.getLogger("segue.scheduler")

REFRESH_S = 0.5  # how often a waiting request is re-announced (it has a lease)


class SchedStore(Store, PoolStore):
    """A store that also implements the pool contract (SQLiteStore does)."""


@dataclass
class RunScheduler:
    store: SchedStore
    run_id: str
    steps: dict[str, StepSpec]
    host: str
    priority: int
    preemptible: bool
    max_pause_s: float
    lease_ttl_s: float
    gpus_override: int = -1
    gpu_memory_override: int = 0
    spawn: Callable[[str], object] | None = None  # starts a detached controller for a run id
    victims: set[str] = field(default_factory=set)
    _announced: dict[str, float] = field(default_factory=dict)
    _reasons: dict[str, str] = field(default_factory=dict)
    _preempt_t0: float = 0.0
    _aged_to: int = 0

    def __post_init__(self) -> None:
        ensure_host(self.store, self.host)
        self._aged_to = self.priority

    # -- needs -----------------------------------------------------------------
    def need(self, step: str) -> Need:
        r = self.steps[step].resources
        gpus = r.gpus
        any_gpu = any(s.resources.gpus for s in self.steps.values())
        if self.gpus_override >= 0 and (r.gpus > 0 or not any_gpu):
            gpus = self.gpus_override
        mem = self.gpu_memory_override or r.gpu_memory
        return Need(gpus=gpus, gpu_memory=mem if gpus else None, cpus=r.cpus, memory=r.memory or 0)

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

    # -- placing ---------------------------------------------------------------
    def try_place(self, step: str, *, actor: Actor) -> Placement | None:
        need = self.need(step)
        if self.victims and not self._victims_parked():
            return None
        prio = self.effective_priority()
        res = self.store.try_start_attempt(
            self.run_id, step, host=self.host, need=need, priority=prio,
            preemptible=self.preemptible, ttl_s=self.lease_ttl_s, actor=actor,
        )
        if isinstance(res, Placement):
            if self.victims:
                self.store.append_event(
                    self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
                    reason=f"placed on devices {list(res.devices)} {time.time() - self._preempt_t0:.2f}s "
                           f"after preempting {', '.join(sorted(self.victims))}",
                    data={"devices": list(res.devices), "victims": sorted(self.victims)},
                )
                self.victims.clear()
            self._announced.pop(step, None)
            self._reasons.pop(step, None)
            return res
        self._announce(step, need, prio, res)
        if not self.victims:
            self._maybe_preempt(step, need, prio)
        return None

    def _announce(self, step: str, need: Need, prio: int, denied: Denied) -> None:
        now = time.monotonic()
        if self._reasons.get(step) != denied.reason:
            self.store.append_event(self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
                                    reason=denied.reason, data={"need": need.describe()})
        if self._reasons.get(step) != denied.reason or now - self._announced.get(step, 0) > REFRESH_S:
            self.store.upsert_request(self.run_id, step, host=self.host, need=need, priority=prio,
                                      reason=denied.reason, ttl_s=self.lease_ttl_s)
            self._announced[step] = now
            self._reasons[step] = denied.reason

    def _victims_parked(self) -> bool:
        for rid in self.victims:
            if self.store.get_run(rid).state in (RunState.RUNNING, RunState.PAUSING):
                return False
        return True

    def holders(self) -> list[Holder]:
        hp = self.store.get_host(self.host)
        mem = {d.index: d.memory for d in hp.devices} if hp else {}
        now = time.time()
        by_run: dict[str, list] = {}
        for a in self.store.list_allocations(self.host):
            if a.run_id != self.run_id:
                by_run.setdefault(a.run_id, []).append(a)
        out = []
        for rid, allocs in by_run.items():
            lost = 0.0
            for a in allocs:
                cks = self.store.list_checkpoints(rid, a.step)
                last = max(cks[0].created_at, a.since) if cks else a.since
                lost += max(0.0, now - last)
            stats = self.store.get_stats(rid)
            out.append(Holder(
                run_id=rid, priority=min(a.priority for a in allocs),
                preemptible=all(a.preemptible for a in allocs),
                devices=tuple(Device(i, mem.get(i, 0)) for a in allocs for i in a.devices),
                cpus=sum(a.cpus for a in allocs), memory=sum(a.memory for a in allocs),
                work_lost_s=lost, preemptions=int(stats.get("preemptions", 0)),
                steps=tuple(a.step for a in allocs),
            ))
        return out

    def _maybe_preempt(self, step: str, need: Need, prio: int) -> None:
        free = self.store.free_capacity(self.host)
        if place(need, free) is not None:
            return  # it fits; we are only waiting for our turn
        holders = self.holders()
        victims = choose_victims(need, free, holders, prio)
        if not victims:
            return
        t = time.time()
        chosen = []
        for v in victims:
            try:
                self.store.transition_run(
                    v.run_id, RunState.PAUSING, actor=Actor.SCHEDULER, only_from=(RunState.RUNNING,),
                    reason=f"preempted by run {self.run_id!r} ({priority_name(prio)}) to free "
                           f"{need.describe()} for step {step!r}",
                )
            except IllegalTransitionError:
                continue
            self.store.add_stats(v.run_id, {"preemptions": 1})
            self.store.set_stats(v.run_id, {"preempted_at": t})
            chosen.append(v)
        if not chosen:
            return
        self.victims = {v.run_id for v in chosen}
        self._preempt_t0 = t
        why = "; ".join(
            f"{v.run_id} ({priority_name(v.priority)}, {v.work_lost_s:.1f}s since its last checkpoint, "
            f"preempted {v.preemptions}x before)" for v in chosen
        )
        self.store.append_event(
            self.run_id, "scheduler", actor=Actor.SCHEDULER, step=step,
            reason=f"preempting {why}: lowest priority first, then least work lost, then least preempted",
            data={"victims": [v.run_id for v in chosen], "need": need.describe()},
        )

    # -- after an attempt -----------------------------------------------------
    def released(self, step: str, epoch: int, *, started_wall: float, outcome: str) -> None:
        """Return the attempt's resources and account for it.

        ``outcome``: "done" | "parked" | "killed" (lost work since the last checkpoint).
        """
        alloc = self.store.release_allocation(self.run_id, step, epoch)
        end = time.time()
        dur = max(0.0, end - started_wall)
        gpus = len(alloc.devices) if alloc else 0
        stats = self.store.get_stats(self.run_id)
        lost = 0.0
        if outcome == "killed":
            cks = [c for c in self.store.list_checkpoints(self.run_id, step) if c.epoch == epoch]
            lost = max(0.0, end - (cks[0].created_at if cks else started_wall))
        deltas = {"attempt_s": dur, "device_s": gpus * dur, f"step:{step}:s": dur}
        if outcome in ("killed", "parked"):
            # Resuming keeps everything this step did before the interruption but
            # the work since its last checkpoint; restarting would redo it all.
            done_s = stats.get(f"step:{step}:s", 0.0) + dur - stats.get(f"step:{step}:lost", 0.0) - lost
            deltas.update({
                "work_redone_s": lost, "device_s_redone": gpus * lost, f"step:{step}:lost": lost,
                "saved_s": max(0.0, done_s), "device_s_saved": gpus * max(0.0, done_s),
            })
        self.store.add_stats(self.run_id, deltas)
        if alloc is not None and (alloc.devices or alloc.cpus):
            self.wake_orphans()

    # -- being preempted --------------------------------------------------------
    def preempted(self) -> bool:
        return self.store.get_stats(self.run_id).get("preempted_at", 0.0) > 0

    def waited_s(self) -> float:
        at = self.store.get_stats(self.run_id).get("preempted_at", 0.0)
        return time.time() - at if at > 0 else 0.0

    def capacity_back(self, tasks: list[TaskRecord], order: list[str]) -> bool:
        """While PAUSED by preemption: is there room again for the next task, in priority order?"""
        done = {t.step for t in tasks if t.state == TaskState.SUCCEEDED}
        states = {t.step: t.state for t in tasks}
        nxt = next((s for s in order if states[s] in (TaskState.PARKED, TaskState.PENDING,
                                                      TaskState.RETRYING)
                    and all(u in done for u in self.steps[s].after)), None)
        if nxt is None:
            return True
        need = self.need(nxt)
        prio = self.effective_priority()
        free = self.store.free_capacity(self.host)
        reason = f"preempted; waiting for {need.describe()} to resume"
        if place(need, free) is None:
            self._announce(nxt, need, prio, Denied(reason))
            return False
        hp = self.store.get_host(self.host)
        total = len(hp.devices) if hp else 0
        mine = time.time() - self.waited_s()
        for r in self.store.list_requests(self.host):
            if r.run_id == self.run_id or r.need.gpus > total:
                continue
            # The same rule as placement: never ahead of a waiting higher class.
            if r.priority > prio or (r.priority == prio and r.submitted_at < mine
                                     and place(r.need, free) is not None):
                self._announce(nxt, need, prio, Denied(f"preempted; waiting behind run {r.run_id!r}"))
                return False
        return True

    def resumed_after_preemption(self) -> float:
        """Clear the preemption mark; returns how long the run waited."""
        waited = self.waited_s()
        self.store.set_stats(self.run_id, {"preempted_at": 0.0})
        self.store.add_stats(self.run_id, {"preempted_wait_s": waited})
        return waited

    def wake_orphans(self) -> None:
        """Preempted runs whose controller is gone would wait forever: start one for each."""
        if self.spawn is None:
            return
        now = time.time()
        for run in self.store.list_runs():
            if run.run_id == self.run_id or run.state != RunState.PAUSED:
                continue
            if run.controller_lease_until is not None and run.controller_lease_until > now and (
                run.controller_host != self.host or pid_alive(run.controller_pid)
            ):
                continue  # its own controller is alive and waiting
            if self.store.get_stats(run.run_id).get("preempted_at", 0.0) > 0:
                log.info("starting a controller for preempted run %s", run.run_id)
                self.store.append_event(run.run_id, "scheduler", actor=Actor.SCHEDULER,
                                        reason=f"capacity freed by run {self.run_id!r}; starting a "
                                               "controller to resume this preempted run")
                self.spawn(run.run_id)
