"""The controller: drives one run until it succeeds, fails, pauses or is cancelled.

One controller per run, enforced by a controller lease with its own epoch in
the store. It starts attempts through an :class:`~segue.executor.Executor`,
watches their exits and leases, applies retries with backoff, and carries out
pause and cancel requests that arrive through the store (from ``segue pause``
in another terminal) or from Ctrl-C. It holds no state that matters: if it
dies, ``segue resume`` builds a new one from the store.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import _faults
from ..errors import FencedError
from ..executor import Executor, Launch, LocalProcessExecutor, WorkerHandle
from ..flow.model import StepSpec
from ..home import Home
from ..scheduler.agent import RunScheduler
from ..states import Actor, RunState, TaskState
from ..store.base import RunRecord, Store, TaskRecord
from .options import RunOptions
from .procs import pid_alive
from .recovery import describe_exit, reclaim_orphan
from .worker import EXIT_FENCED, EXIT_OK, EXIT_ORPHANED, EXIT_PARKED

log = logging.getLogger("segue.controller")

TICK_S = 0.05


@dataclass
class _Attempt:
    step: str
    epoch: int
    handle: WorkerHandle
    started: float
    started_wall: float
    pause_signalled: bool = False
    killed_for: str | None = None  # "pause-deadline" | "lease" | "stop" | "cancel"


@dataclass
class Interrupts:
    """Set by the CLI's signal handler; read by the loop (handlers only set flags)."""

    pause: bool = False
    stop_now: bool = False
    count: int = 0

    def hit(self) -> None:
        self.count += 1
        if self.count == 1:
            self.pause = True
        else:
            self.stop_now = True


@dataclass
class Controller:
    home: Home
    store: Store
    run_id: str
    steps: dict[str, StepSpec]
    order: list[str]
    executor: Executor = field(default_factory=LocalProcessExecutor)
    actor: Actor = Actor.CLI
    on_tick: Callable[[RunRecord, list[TaskRecord]], None] | None = None
    interrupts: Interrupts = field(default_factory=Interrupts)

    def __post_init__(self) -> None:
        _faults.set_role("controller")
        self.host = socket.gethostname()
        self._prev_host: str | None = None
        self.epoch = 0
        self.attempts: dict[str, _Attempt] = {}
        self._pause_t0: float | None = None
        self._failure_pause_sent = False
        run = self.store.get_run(self.run_id)
        self.options = RunOptions.from_json(run.options)
        self.sched = RunScheduler(
            store=self.store,  # type: ignore[arg-type]  # SQLiteStore implements both contracts
            run_id=self.run_id, steps=self.steps, host=self.host,
            priority=self.options.priority, preemptible=self.options.is_preemptible,
            max_pause_s=self.options.max_pause_s, lease_ttl_s=self.options.lease_ttl_s,
            gpus_override=self.options.gpus, gpu_memory_override=self.options.gpu_memory,
            spawn=self._spawn_controller,
        )

    def _spawn_controller(self, run_id: str) -> None:
        from .ops import spawn_detached  # ops builds on this module

        spawn_detached(self.home, run_id)

    # -- ownership -----------------------------------------------------------
    def acquire(self) -> None:
        """Take the controller lease; steal it only from a provably dead local holder."""
        run = self.store.get_run(self.run_id)
        self._prev_host = run.controller_host  # where the previous controller ran its workers
        steal = (
            run.controller_alive()
            and run.controller_host == self.host
            and not pid_alive(run.controller_pid)
        )
        self.epoch = self.store.acquire_controller(
            self.run_id, pid=os.getpid(), host=self.host, ttl_s=self.options.lease_ttl_s, steal=steal
        )
        self._next_renew = time.monotonic() + self.options.lease_ttl_s / 4

    def release(self) -> None:
        if self.epoch:
            self.store.release_controller(self.run_id, self.epoch)

    # -- start / resume --------------------------------------------------------
    def prepare(self, reason: str, actor: Actor | None = None) -> None:
        """Make the stored run runnable: adopt orphans, requeue parked and failed tasks."""
        run = self.store.get_run(self.run_id)
        prev_host = self._prev_host
        if run.state == RunState.PAUSED and self.sched.preempted() and actor is None:
            return  # it waits, PAUSED, for capacity; the loop resumes it
        who = actor or self.actor
        for t in self.store.get_tasks(self.run_id):
            if t.state == TaskState.RUNNING:
                self._reclaim_orphan(t, prev_host)
            elif t.state == TaskState.PARKED:
                self.store.transition_task(self.run_id, t.step, TaskState.PENDING, actor=who,
                                           reason=reason)
            elif t.state == TaskState.FAILED:
                self.store.transition_task(self.run_id, t.step, TaskState.PENDING, actor=who,
                                           reason=reason, reset_failures=True)
        if run.state != RunState.RUNNING:
            self.store.transition_run(self.run_id, RunState.RUNNING, actor=who, reason=reason,
                                      controller_epoch=self.epoch)

    def _reclaim_orphan(self, t: TaskRecord, prev_host: str | None) -> None:
        reclaim_orphan(self.store, self.run_id, t, prev_host=prev_host, host=self.host,
                       ttl_s=self.options.lease_ttl_s, actor=self.actor)

    # -- the loop ------------------------------------------------------------
    def drive(self) -> RunState:
        try:
            while True:
                run = self._renew_or_read()
                if run is None:
                    return self.store.get_run(self.run_id).state
                tasks = self.store.get_tasks(self.run_id)
                if self._reap(tasks):  # an exit changed the stored state: read it again
                    tasks = self.store.get_tasks(self.run_id)
                    run = self.store.get_run(self.run_id)
                final = self._step(run, tasks)
                if self.on_tick is not None:  # the display lags a tick; its last frame re-reads
                    self.on_tick(run, tasks)
                if final is not None:
                    return final
                time.sleep(TICK_S)
        finally:
            self._kill_all("stop")
            self.store.drop_request(self.run_id)  # type: ignore[attr-defined]
            self.release()

    def _renew_or_read(self) -> RunRecord | None:
        if time.monotonic() >= self._next_renew:
            self._next_renew = time.monotonic() + self.options.lease_ttl_s / 4
            try:
                return self.store.renew_controller(self.run_id, self.epoch, self.options.lease_ttl_s)
            except FencedError:
                log.warning("another controller took over run %s; this one stops", self.run_id)
                self.epoch = 0  # nothing of ours to release
                return None
        return self.store.get_run(self.run_id)

    def _step(self, run: RunRecord, tasks: list[TaskRecord]) -> RunState | None:
        ints = self.interrupts
        if ints.stop_now:
            return self._stop_now()
        if ints.pause and run.state == RunState.RUNNING:
            ints.pause = False
            run = self.store.transition_run(self.run_id, RunState.PAUSING, actor=Actor.CLI,
                                            reason="ctrl-c: pausing at the next pause point",
                                            controller_epoch=self.epoch)
        if run.state == RunState.CANCELLED:
            self._kill_all("cancel")
            for t in tasks:
                if not t.state.done:
                    self.store.transition_task(self.run_id, t.step, TaskState.CANCELLED,
                                               actor=self.actor, reason="run cancelled")
            return RunState.CANCELLED
        if run.state == RunState.PAUSING:
            return self._pausing(tasks)
        if run.state == RunState.PAUSED and self.sched.preempted():
            if self.sched.capacity_back(tasks, self.order):
                waited = self.sched.resumed_after_preemption()
                self._pause_t0 = None
                self.prepare(f"resources are free again; resuming after preemption "
                             f"(waited {waited:.2f}s paused)",
                             actor=Actor.SCHEDULER)
            return None
        if run.state != RunState.RUNNING:
            return run.state
        by_state = {t.step: t for t in tasks}
        if all(t.state == TaskState.SUCCEEDED for t in tasks):
            self.store.transition_run(self.run_id, RunState.SUCCEEDED, actor=Actor.CONTROLLER,
                                      reason="every step succeeded", controller_epoch=self.epoch)
            return RunState.SUCCEEDED
        failed = [t for t in tasks if t.state == TaskState.FAILED]
        if failed:
            return self._failing(failed)
        self._schedule(by_state)
        return None

    def _failing(self, failed: list[TaskRecord]) -> RunState | None:
        # Park the others so their progress is kept, then stop the run.
        if not self._failure_pause_sent:
            self._failure_pause_sent = True
            for a in self.attempts.values():
                a.handle.request_pause()
        if self.attempts:
            return None
        names = ", ".join(t.step for t in failed)
        if self.options.pause_on_failure:
            self.store.transition_run(self.run_id, RunState.PAUSED, actor=Actor.CONTROLLER,
                                      reason=f"step {names} exhausted its retries (pause_on_failure)",
                                      controller_epoch=self.epoch)
            return RunState.PAUSED
        self.store.transition_run(self.run_id, RunState.FAILED, actor=Actor.CONTROLLER,
                                  reason=f"step {names} exhausted its retries; `segue resume` retries it",
                                  controller_epoch=self.epoch)
        return RunState.FAILED

    def _pausing(self, tasks: list[TaskRecord]) -> RunState | None:
        now = time.monotonic()
        if self._pause_t0 is None:
            self._pause_t0 = now
        for a in self.attempts.values():
            if not a.pause_signalled:
                a.pause_signalled = True
                a.handle.request_pause()
            elif a.killed_for is None and now - self._pause_t0 > self.options.pause_deadline_s:
                a.killed_for = "pause-deadline"
                a.handle.kill()
        if self.attempts:
            return None
        for t in tasks:
            if t.state == TaskState.RETRYING:
                self.store.transition_task(self.run_id, t.step, TaskState.PARKED, actor=self.actor,
                                           reason="paused while waiting to retry")
        self.store.transition_run(self.run_id, RunState.PAUSED, actor=Actor.CONTROLLER,
                                  reason="every task parked", controller_epoch=self.epoch)
        self._pause_t0 = None
        if self.sched.preempted():
            return None  # stay, PAUSED, and resume by ourselves when capacity frees
        return RunState.PAUSED

    def _stop_now(self) -> RunState:
        self._kill_all("stop")
        for t in self.store.get_tasks(self.run_id):
            if t.state == TaskState.RETRYING:
                self.store.transition_task(self.run_id, t.step, TaskState.PARKED, actor=Actor.CLI,
                                           reason="stopped at once")
        run = self.store.get_run(self.run_id)
        if run.state in (RunState.RUNNING, RunState.PAUSING):
            self.store.transition_run(self.run_id, RunState.PAUSED, actor=Actor.CLI,
                                      reason="second ctrl-c: stopped at once; resume continues "
                                             "from the last checkpoints", controller_epoch=self.epoch)
        return self.store.get_run(self.run_id).state

    def _kill_all(self, why: str) -> None:
        for a in self.attempts.values():
            if a.killed_for is None:
                a.killed_for = why
            a.handle.kill()
        deadline = time.monotonic() + 10
        while self.attempts and time.monotonic() < deadline:
            self._reap(self.store.get_tasks(self.run_id))
            time.sleep(0.01)

    # -- attempts ------------------------------------------------------------
    def _schedule(self, tasks: dict[str, TaskRecord]) -> None:
        now = time.time()
        budget = self.options.max_parallel_cpus
        used = sum(self.steps[a.step].resources.cpus for a in self.attempts.values())
        for name in self.order:
            t = tasks[name]
            if name in self.attempts:
                continue
            ready = (
                t.state == TaskState.PENDING
                and all(tasks[u].state == TaskState.SUCCEEDED for u in self.steps[name].after)
            ) or (t.state == TaskState.RETRYING and (t.next_attempt_at or 0) <= now)
            if not ready:
                continue
            need = self.steps[name].resources.cpus
            if budget and self.attempts and used + need > budget:
                break
            if self._launch(name):
                used += need

    def _launch(self, step: str) -> bool:
        placed = self.sched.try_place(step, actor=Actor.CONTROLLER)
        if placed is None:
            return False  # waiting for resources; the reason is in `segue queue`
        rec = placed.task
        devices = ",".join(str(d) for d in placed.devices)
        logs = self.home.logs_dir(self.run_id)
        handle = self.executor.launch(Launch(
            home=self.home.root, run_id=self.run_id, step=step, epoch=rec.epoch,
            log_path=logs / f"{step}.log",
            # A task sees exactly its own devices (none for a CPU step).
            env={"CUDA_VISIBLE_DEVICES": devices, "SEGUE_DEVICES": devices},
        ))
        self.attempts[step] = _Attempt(step, rec.epoch, handle, time.monotonic(), time.time())
        if handle.pid is not None:
            # Recorded now, not only by the worker once it has imported everything:
            # a successor controller must know which process to stop.
            try:
                self.store.set_attempt_pid(self.run_id, step, rec.epoch, handle.pid, self.host)
            except FencedError:
                pass
        log.info("started %s attempt %d (epoch %d, pid %s, devices [%s])", step, rec.attempts,
                 rec.epoch, handle.pid, devices)
        return True

    def _reap(self, tasks: list[TaskRecord]) -> bool:
        """Handle attempts that exited (or hung); True if any exited."""
        by_step = {t.step: t for t in tasks}
        exited = False
        now = time.time()
        for step, a in list(self.attempts.items()):
            code = a.handle.poll()
            t = by_step[step]
            if code is None:
                # Hung attempt: alive but its heartbeat stopped renewing the lease.
                if (t.state == TaskState.RUNNING and t.epoch == a.epoch and t.lease_until
                        and t.lease_until < now and a.killed_for is None):
                    a.killed_for = "lease"
                    a.handle.kill()
                continue
            del self.attempts[step]
            exited = True
            outcome = self._on_exit(a, code, self.store.get_task(self.run_id, step))
            self.sched.released(step, a.epoch, started_wall=a.started_wall, outcome=outcome)
        return exited

    def _on_exit(self, a: _Attempt, code: int, t: TaskRecord) -> str:
        """Record what the attempt's exit means; returns done | parked | killed."""
        mine = t.epoch == a.epoch
        if not mine or code in (EXIT_FENCED, EXIT_ORPHANED) and t.state != TaskState.RUNNING:
            return "killed"  # superseded: the newer attempt owns the task
        if t.state == TaskState.SUCCEEDED and code == EXIT_OK:
            return "done"
        if t.state == TaskState.PARKED and code == EXIT_PARKED:
            run = self.store.get_run(self.run_id)
            if run.state == RunState.RUNNING and not self._failure_pause_sent:
                # Parked by a signal from outside (e.g. SIGTERM); keep going.
                self.store.transition_task(self.run_id, a.step, TaskState.PENDING, actor=Actor.CONTROLLER,
                                           reason="parked outside a pause; rescheduling")
            return "parked"
        if t.state != TaskState.RUNNING:
            return "done" if t.state == TaskState.SUCCEEDED else "killed"
        if a.killed_for in ("pause-deadline", "stop"):
            self.store.transition_task(
                self.run_id, a.step, TaskState.PARKED, actor=Actor.CONTROLLER, epoch=a.epoch,
                reason=("killed at the pause deadline" if a.killed_for == "pause-deadline"
                        else "stopped at once") + "; it resumes from its last checkpoint",
            )
            return "killed"
        if a.killed_for == "cancel":
            return "killed"
        error, retryable = self._describe_exit(a, code)
        retries = self.steps[a.step].retries
        # Retries count consecutive failures without progress: an attempt that
        # committed a checkpoint moved the step forward, so a long job that
        # crashes now and then is not failed for its total number of crashes.
        progressed = any(c.epoch == a.epoch for c in self.store.list_checkpoints(self.run_id, a.step)[:1])
        failures = 1 if progressed else t.failures + 1
        if retryable and failures <= retries:
            delay = self.options.backoff(failures)
            self.store.transition_task(
                self.run_id, a.step, TaskState.RETRYING, actor=Actor.FAILURE_DETECTOR, epoch=a.epoch,
                reason=f"{error}; retry {failures} of {retries} in {delay:.1f}s",
                count_failure=True, reset_failures=progressed, error=error,
                next_attempt_at=time.time() + delay,
            )
        else:
            self.store.transition_task(
                self.run_id, a.step, TaskState.FAILED, actor=Actor.FAILURE_DETECTOR, epoch=a.epoch,
                reason=f"{error}; " + (f"retries exhausted ({retries})" if retryable else "not retryable"),
                count_failure=True, reset_failures=progressed, error=error,
            )
        return "killed"

    def _describe_exit(self, a: _Attempt, code: int) -> tuple[str, bool]:
        return describe_exit(self.home, self.run_id, a.step, a.epoch, code, lease_lost=a.killed_for == "lease")
