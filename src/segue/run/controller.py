"""The controller: drives one run until it succeeds, fails, pauses or is cancelled.

One controller per run, enforced by a controller lease with its own epoch in
the store. It starts attempts through an :class:`~segue.executor.Executor`,
watches their exits and leases, applies retries with backoff, and carries out
pause and cancel requests that arrive through the store (from ``segue pause``
in another terminal) or from Ctrl-C. It holds no state that matters: if it
dies, ``segue resume`` builds a new one from the store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import _faults
from .._procs import pid_alive
from ..errors import FencedError, StoreError
from ..executor import Executor, Launch, LocalProcessExecutor, WorkerHandle
from ..executor.exits import EXIT_FENCED, EXIT_OK, EXIT_ORPHANED, EXIT_PARKED
from ..flow.model import StepSpec, task_step
from ..home import Home
from ..hostname import given_host, this_host
from ..scheduler.agent import RunScheduler
from ..states import Actor, RunState, TaskState
from ..store.base import Clock, RunRecord, Store, TaskRecord
from ..store.hostpool import home_key, pool_path
from ..store.pools import open_pool
from .logs import attempt_log_path, record_failure
from .options import RunOptions
from .outage import EXIT_DISK_FULL, describe_store_failure, store_unwritable
from .paths import PathError, Paths
from .recovery import attempt_start, describe_exit, last_alive, reclaim_orphan
from .spawn import spawn_detached
from .storage_check import shared_storage
from .worker_options import WorkerOptions

if TYPE_CHECKING:
    from ..checkpoint import CheckpointStorage

log = logging.getLogger("segue.controller")
# How long a worker an executor started elsewhere (Ray) may take to record its pid
# before its lapsed lease counts as a hang: a busy node starts Python slowly.
WORKER_START_S = 300.0

TICK_S = 0.05
STORE_WAIT_S = 600.0
"""How long a controller keeps retrying a store it cannot write before it gives up."""


@dataclass
class _Attempt:
    step: str
    epoch: int
    handle: WorkerHandle
    started: float
    started_wall: float
    pause_signalled: bool = False
    killed_for: str | None = None  # "pause-deadline" | "lease" | "stop" | "cancel"
    outcome: str | None = None  # recorded in the store; set once, so a retried reap skips it
    up_since: float | None = None  # when its worker was first seen to have recorded its pid

    def starting(self, worker_pid: int | None, ttl_s: float) -> bool:
        """Whether the lease it got at launch cannot be expected renewed yet: a worker
        placed elsewhere (Ray) that has not recorded its pid (at most WORKER_START_S),
        or did so less than a lease ago (its start may have used that lease up
        before its first heartbeat). A local worker's pid is known at launch."""
        if self.handle.pid is not None:
            return False
        now = time.monotonic()
        if worker_pid is None:
            return now - self.started < WORKER_START_S
        if self.up_since is None:
            self.up_since = now
        return now - self.up_since < ttl_s


@dataclass
class Interrupts:
    """Set by the CLI's signal handler; read by the loop (handlers only set flags)."""

    pause: bool = False
    stop_now: bool = False
    count: int = 0
    source: str = "ctrl-c"  # what the events name: ctrl-c (SIGINT) or the signal, e.g. SIGTERM

    def hit(self, signum: int | None = None) -> None:
        if signum is not None and signum != signal.SIGINT:
            self.source = signal.Signals(signum).name
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
    actor: str = Actor.CLI
    on_tick: Callable[[RunRecord, list[TaskRecord]], None] | None = None
    interrupts: Interrupts = field(default_factory=Interrupts)
    # How long to keep retrying an unwritable store; SEGUE_STORE_WAIT_S overrides it.
    store_wait_s: float = field(
        default_factory=lambda: float(os.environ.get("SEGUE_STORE_WAIT_S", STORE_WAIT_S)))
    # Clock for lease expiry and retry deadlines, the same one the store stamps
    # leases with (time is a dependency: tests advance a virtual one). None:
    # the store's own (``Store.now``: the database's on PostgreSQL).
    clock: Clock | None = None
    # The host's device pool (None: the one $SEGUE_POOL names, see store.hostpool);
    # controllers this one starts for preempted runs get the same.
    pool_path: str | None = None
    # A host agent's claim (controller epoch, the replaced controller's host):
    # acquire takes the lease over at that epoch only (Store.acquire_controller).
    claim: tuple[int, str | None] | None = None

    def __post_init__(self) -> None:
        _faults.set_role("controller")
        self._now: Clock = self.clock or self.store.now
        self.host = this_host()
        # The store every worker is told (resolved once: an explicit one, $SEGUE_STORE or
        # the home's config; None for SQLite in the home).
        self._store_url = self.home.store_url()
        self._prev_host: str | None = None
        self.epoch = 0
        self.attempts: dict[str, _Attempt] = {}
        self._pause_t0: float | None = None
        self._failure_pause_sent = False
        self._disk_full: str | None = None  # an attempt's disk-full error: the run pauses
        self._not_retryable: dict[str, str] = {}  # step -> the error it failed of without a retry
        run = self.store.get_run(self.run_id)
        self.options = RunOptions.from_json(run.options)
        self.flow_path = run.flow_path  # an executor that places attempts elsewhere ships it
        # The pool: host-wide, or cluster-wide with a PostgreSQL store (store.hostpool).
        pool = open_pool(self.pool_path or pool_path(self.home.root, store=self.home.store), store=self.store)
        self.moved_to: str | None = None  # the host the run was handed over to, if any
        self._path_error: str | None = None  # a decision of the run's path could not be made
        self._decisions_read = False
        self._run_storage: CheckpointStorage | None = None
        self.paths = Paths(self.steps, self.order, self._read_state, self._read_value, decided=set())
        self.sched = RunScheduler(
            store=self.store, pool=pool, home=home_key(self.home.root, self.store),
            run_id=self.run_id, steps=self.steps, host=self.host,
            # Ray: the cluster's GPUs are a host of the pool of their own.
            cluster_host=self.executor.pool_host(),
            shared_storage=shared_storage(self.options.checkpoints),
            priority=self.options.priority, preemptible=self.options.is_preemptible,
            max_pause_s=self.options.max_pause_s, lease_ttl_s=self.options.lease_ttl_s,
            gpus_override=self.options.gpus, gpu_memory_override=self.options.gpu_memory,
            spawn=self._spawn_controller, store_url=self.home.store,
        )

    # -- the run's path (run/paths.py) -------------------------------------------------
    def _storage(self) -> CheckpointStorage:
        if self._run_storage is None:  # opened once, on the first decision that reads an output
            self._run_storage = self.home.run_storage(self.store.get_run(self.run_id))
        return self._run_storage

    def _read_state(self, task: str, ref: str) -> dict[str, object]:
        from ..checkpoint import load  # the checkpoint engine only for a flow that decides

        state = load(self._storage(), ref, allow_pickle=self._spec_of(task).allow_pickle).state
        return state if isinstance(state, dict) else {}

    def _read_value(self, task: str) -> object:
        from .stepio import load_output

        return load_output(self.store, self._storage(), self.run_id, task,
                           self.store.get_task(self.run_id, task).output_ref,
                           allow_pickle=self._spec_of(task).allow_pickle)

    def _spec_of(self, task: str) -> StepSpec:
        return self.steps[task_step(task)[0]]

    def _decide(self, tasks: dict[str, TaskRecord]) -> bool:
        """Record what the committed outputs decided (fan-outs, branches, loops); True if
        anything was written. A decision that cannot be made fails the run, with why."""
        if self._path_error is not None:
            return False
        try:
            plan = self.paths.plan(tasks)
        except (PathError, StoreError) as exc:
            self._path_error = str(exc)
            return False
        for d in plan.decisions:
            _faults.fault_point("controller.before_decision")
            self.store.record_decision(self.run_id, d.step, controller_epoch=self.epoch, actor=Actor.CONTROLLER,
                                       reason=d.reason, add=d.add, skip=d.skip, data=d.data, epoch=d.epoch)
            self.paths.decided.add(d.step)
            _faults.fault_point("controller.after_decision")
        for c in plan.completions:
            rec = self.store.start_attempt(self.run_id, c.step, ttl_s=self.options.lease_ttl_s,
                                           actor=Actor.CONTROLLER)
            self.store.complete_task(self.run_id, c.step, rec.epoch, output_ref=c.output_ref,
                                     actor=Actor.CONTROLLER)
        return bool(plan.decisions or plan.completions)

    def _spawn_controller(self, home: str, run_id: str) -> None:
        # A run of this store (every run of a cluster's store has its key) is this home's.
        spawn_detached(self.home if home == self.sched.home else Home.resolve(home, store=self.home.store),
                       run_id, pool=self.pool_path)

    # -- ownership -----------------------------------------------------------
    def acquire(self) -> None:
        """Take the controller lease; steal it only from a provably dead local holder."""
        with self._one_line_store_errors():
            self._acquire()

    @contextlib.contextmanager
    def _one_line_store_errors(self) -> Iterator[None]:
        # Before the loop owns anything, an unwritable store is the operator's to fix.
        try:
            yield
        except Exception as exc:
            if not store_unwritable(exc):
                raise
            raise StoreError(describe_store_failure(exc, self.home.db_path, self.run_id)) from exc

    def _acquire(self) -> None:
        run = self.store.get_run(self.run_id)
        self._prev_host = run.controller_host  # where the previous controller ran its workers
        if self.claim is not None:  # the agent's claim stands in for the controller it replaced
            self._prev_host = self.claim[1]
            self.epoch = self.store.acquire_controller(
                self.run_id, pid=os.getpid(), host=self.host, ttl_s=self.options.lease_ttl_s,
                expect_epoch=self.claim[0])
            self._next_renew = time.monotonic() + self.options.lease_ttl_s / 4
            return
        steal = (
            run.controller_alive(self.store.now())
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
    def prepare(self, reason: str, actor: str | None = None) -> None:
        """Make the stored run runnable: adopt orphans, requeue parked and failed tasks."""
        with self._one_line_store_errors():
            self._prepare(reason, actor)

    def _prepare(self, reason: str, actor: str | None) -> None:
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
        last = reclaim_orphan(self.store, self.run_id, t, prev_host=prev_host, host=self.host,
                              ttl_s=self.options.lease_ttl_s, actor=self.actor)
        started = None if last is None else attempt_start(self.store, self.run_id, t.step, t.epoch)
        if last is not None and started is not None:
            # Charged as a killed attempt is, up to its last heartbeat (docs/accounting.md).
            self.sched.lost(t.step, t.epoch, started=started, last_alive=last_alive(last))

    # -- the loop ------------------------------------------------------------
    def drive(self) -> RunState:
        from ..notify.notifier import start_notifier  # webhooks: its own thread; never raises

        notifier = start_notifier(self.home)
        try:
            while True:
                try:
                    final = self._tick()
                except Exception as exc:
                    if not store_unwritable(exc):
                        raise
                    final = self._ride_out_outage(exc)
                if final is not None:
                    return final
                time.sleep(TICK_S)
        finally:
            try:
                self._shutdown()
            finally:
                if notifier is not None:
                    notifier.stop()  # bounded drain: the final transition's webhook leaves now

    def _tick(self) -> RunState | None:
        if not self._decisions_read and any(s.choices or s.dynamic for s in self.steps.values()):
            # What the store says was decided; a step started over since (`--restart-step`)
            # decides again.
            for e in self.store.list_events(self.run_id, kinds=("decision", "restart-step", "restart-path")):
                if e.kind == "restart-path":  # the tasks it dropped: new ones start above their epochs
                    for group, floor in (e.data.get("floors") or {}).items():
                        self.paths.floors[group] = max(self.paths.floors.get(group, 0), int(floor))
                elif e.step and e.kind == "decision":
                    self.paths.decided.add(e.step)
                elif e.step:
                    self.paths.decided.discard(e.step)
            self._decisions_read = True
        run = self._renew_or_read()
        if run is None:
            return self.store.get_run(self.run_id).state
        # Preemption requests from any home arrive through the host pool.
        if self.sched.tick(self.epoch, {s: a.epoch for s, a in self.attempts.items()}):
            run = self.store.get_run(self.run_id)
        tasks = self.store.get_tasks(self.run_id)
        if self._reap(tasks):  # an exit changed the stored state: read it again
            tasks = self.store.get_tasks(self.run_id)
            run = self.store.get_run(self.run_id)
        final = self._step(run, tasks)
        if self.on_tick is not None:  # the display lags a tick; its last frame re-reads
            self.on_tick(run, tasks)
        return final

    def _shutdown(self) -> None:
        # Runs on every way out. A store that cannot be written must not turn the
        # way out into a traceback that hides the real outcome: the attempts are
        # killed first (no store needed), and an unreleased lease expires by itself.
        steps: list[tuple[str, Callable[[], object]]] = [
            ("stop its attempts", lambda: self._kill_all("stop")),
            ("close its scheduler", self.sched.close),
            ("release its lease", self.release),
        ]
        for what, fn in steps:
            try:
                fn()
            except Exception as exc:
                if not store_unwritable(exc):
                    raise
                log.warning("controller of run %s could not %s: %s", self.run_id, what, exc)

    # -- the metadata store cannot be written ------------------------------------
    def _ride_out_outage(self, exc: BaseException) -> RunState | None:
        """Retry; if the store stays unwritable, stop the attempts and record a pause.

        None: a retried tick got through, carry on. Otherwise the state recorded.
        Raises StoreError only after ``store_wait_s`` without one successful write;
        the run is then RUNNING with no controller, which ``segue status`` reports.
        """
        t0 = time.monotonic()
        delay = TICK_S
        log.warning("run %s: the metadata store cannot be written (%s); retrying",
                    self.run_id, exc)
        # A brief outage (a busy lock, a disk freed in time): ride it out, attempts
        # alive. The probe is a write (renewing our lease): most ticks only read,
        # and a tick that got through would say nothing about the next write.
        while time.monotonic() - t0 < self.options.lease_ttl_s:
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                self.store.renew_controller(self.run_id, self.epoch, self.options.lease_ttl_s)
                self._next_renew = time.monotonic() + self.options.lease_ttl_s / 4
                log.warning("run %s: the metadata store takes writes again", self.run_id)
                return None
            except FencedError:
                log.warning("another controller took over run %s; this one stops", self.run_id)
                self.epoch = 0
                return self.store.get_run(self.run_id).state
            except Exception as e:
                if not store_unwritable(e):
                    raise
                exc = e
        reason = describe_store_failure(exc, self.home.db_path, self.run_id)
        # The attempts cannot commit a checkpoint now, so their work since the last
        # one is lost anyway; stopped, they resume from it.
        log.warning("run %s: %s; stopping its attempts; the run pauses as soon as the store "
                    "can be written", self.run_id, reason)
        for a in self.attempts.values():
            a.killed_for = a.killed_for or "stop"
            a.handle.kill()
        while True:
            try:
                return self._record_outage(reason)
            except FencedError:
                log.warning("another controller took over run %s; this one stops", self.run_id)
                self.epoch = 0
                return self.store.get_run(self.run_id).state
            except Exception as e:
                if not store_unwritable(e):
                    raise
            waited = time.monotonic() - t0
            if waited > self.store_wait_s:
                raise StoreError(
                    f"{reason}; gave up after {waited:.0f}s: run {self.run_id} is left RUNNING "
                    "with no controller (`segue status` says so)"
                ) from None
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _record_outage(self, reason: str) -> RunState:
        deadline = time.monotonic() + 10  # they were SIGKILLed: this is quick
        while any(a.handle.poll() is None for a in self.attempts.values()):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self._reap(self.store.get_tasks(self.run_id))
        run = self.store.get_run(self.run_id)
        if run.state not in (RunState.RUNNING, RunState.PAUSING):
            return run.state
        for t in self.store.get_tasks(self.run_id):
            if t.state == TaskState.RETRYING:
                self.store.transition_task(self.run_id, t.step, TaskState.PARKED, actor=self.actor,
                                           reason="paused while waiting to retry")
        self.store.transition_run(self.run_id, RunState.PAUSED, actor=Actor.CONTROLLER,
                                  reason=f"{reason}; every task parked",
                                  controller_epoch=self.epoch)
        log.warning("run %s paused: %s", self.run_id, reason)
        return RunState.PAUSED

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
                                            reason=f"{ints.source}: pausing at the next pause point",
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
            never = self.sched.never_fits_next(tasks, self.order)
            if never is not None:
                # The pool shrank while the run waited: waiting is for ever. Resume it
                # only to fail it with the reason, as a run waiting in RUNNING would.
                self.sched.resumed_after_preemption()
                self.prepare(f"{never}; it no longer waits for capacity", actor=Actor.SCHEDULER)
                return self._unsatisfiable(never)
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
        if self._decide(by_state):
            tasks = self.store.get_tasks(self.run_id)
            by_state = {t.step: t for t in tasks}
        if all(t.state.settled for t in tasks):
            self.store.transition_run(self.run_id, RunState.SUCCEEDED, actor=Actor.CONTROLLER,
                                      reason="every step succeeded" if all(
                                          t.state == TaskState.SUCCEEDED for t in tasks)
                                      else "every step succeeded or was skipped",
                                      controller_epoch=self.epoch)
            return RunState.SUCCEEDED
        if self._path_error is not None:
            return self._path_failed(self._path_error)
        if self._disk_full is not None:
            # An attempt ran out of space: park the others at their next checkpoint
            # (or the pause deadline) rather than let them fail the same way.
            self.store.transition_run(self.run_id, RunState.PAUSING, actor=Actor.CONTROLLER,
                                      reason=self._disk_full, controller_epoch=self.epoch)
            self._disk_full = None  # recorded
            return None
        failed = [t for t in tasks if t.state == TaskState.FAILED]
        if failed:
            return self._failing(failed)
        self._schedule(by_state)
        if self.sched.move_to is not None and not self.attempts:
            return self._hand_over(*self.sched.move_to)
        if self.sched.unsatisfiable:
            return self._unsatisfiable(self.sched.unsatisfiable)
        return None

    def _hand_over(self, host: str, why: str) -> RunState:
        """Leave the run, RUNNING, to the agent of ``host`` (a cluster-wide pool): this
        controller releases its lease on the way out and that agent starts one there."""
        self.store.append_event(
            self.run_id, "scheduler", actor=Actor.SCHEDULER,
            reason=f"moving the run to host {host}: {why}; the agent of host {host} starts "
                   "its controller there",
            data={"host": host, "from_host": self.host})
        self.sched.moved = True
        self.moved_to = host
        return RunState.RUNNING

    def _unsatisfiable(self, why: str) -> RunState | None:
        # The pool shrank under the run (`segue pool set` smaller): fail it with
        # the reason rather than wait for ever. Running steps park first.
        self._failure_pause_sent = True  # a parked step is not rescheduled
        for a in self.attempts.values():
            if not a.pause_signalled:
                a.pause_signalled = True
                a.handle.request_pause()
        if self.attempts:
            return None
        self.store.transition_run(self.run_id, RunState.FAILED, actor=Actor.SCHEDULER,
                                  reason=f"{why}; add capacity (`segue pool set --gpus N`), then "
                                         f"`segue resume {self.run_id}`",
                                  controller_epoch=self.epoch)
        return RunState.FAILED

    def _park_others(self) -> bool:
        """Ask every attempt to park, once (their progress is kept); True while any runs."""
        if not self._failure_pause_sent:
            self._failure_pause_sent = True
            for a in self.attempts.values():
                a.handle.request_pause()
        return bool(self.attempts)

    def _path_failed(self, why: str) -> RunState | None:
        # The others park first; the run fails with the reason.
        if self._park_others():
            return None
        self.store.transition_run(self.run_id, RunState.FAILED, actor=Actor.CONTROLLER, reason=why,
                                  controller_epoch=self.epoch)
        return RunState.FAILED

    def _failing(self, failed: list[TaskRecord]) -> RunState | None:
        # Park the others so their progress is kept, then stop the run.
        if self._park_others():
            return None
        errors = {t.step: self._not_retryable_error(t) for t in failed}
        why = "; ".join(f"step {step} exhausted its retries" if e is None else
                        f"step {step} failed (not retryable): {e}" for step, e in errors.items())
        if self.options.pause_on_failure:
            self.store.transition_run(self.run_id, RunState.PAUSED, actor=Actor.CONTROLLER,
                                      reason=f"{why} (pause_on_failure)", controller_epoch=self.epoch)
            return RunState.PAUSED
        if all(e is None for e in errors.values()):  # a not-retryable error says what to fix itself
            why += "; `segue resume` retries it"
        self.store.transition_run(self.run_id, RunState.FAILED, actor=Actor.CONTROLLER,
                                  reason=why, controller_epoch=self.epoch)
        return RunState.FAILED

    def _not_retryable_error(self, t: TaskRecord) -> str | None:
        """The error a FAILED step stopped at because no retry could help; None: its retries ran out."""
        error = self._not_retryable.get(t.step)
        spec = self.steps.get(t.step)
        if error is None and spec is not None and t.failures <= spec.retries:
            error = t.error or "an error no retry can fix"  # failed with retries left (an earlier controller)
        return error

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
                                      reason=f"second {self.interrupts.source}: stopped at once; "
                                             "resume continues from the last checkpoints",
                                      controller_epoch=self.epoch)
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
        now = self._now()
        budget = self.options.max_parallel_cpus
        used = sum(self.steps[a.step].resources.cpus for a in self.attempts.values())
        unplaced: set[str] = set()  # a group's tasks all need the same: one that waits, all wait
        for name in tasks:  # a fan-out's items and a loop's iterations run as their step
            if name not in self.steps:
                self.steps[name] = self._spec_of(name)
        for name in self.paths.expanded_order(tasks):
            t = tasks[name]
            group = task_step(name)[0]
            if name in self.attempts or group in unplaced:
                continue
            ready = (
                t.state == TaskState.PENDING and self.paths.may_start(name, tasks)
            ) or (t.state == TaskState.RETRYING and (t.next_attempt_at or 0) <= now)
            if not ready:
                continue
            need = self.steps[name].resources.cpus
            if budget and self.attempts and used + need > budget:
                break
            if self._launch(name):
                used += need
            elif group != name:
                unplaced.add(group)

    def _launch(self, step: str) -> bool:
        placed = self.sched.try_place(step, actor=Actor.CONTROLLER)
        if placed is None:
            return False  # waiting for resources; the reason is in `segue queue`
        rec = placed.task
        devices = ",".join(str(d) for d in placed.devices)
        handle = self.executor.launch(Launch(
            home=self.home.root, run_id=self.run_id, step=step, epoch=rec.epoch,
            log_path=attempt_log_path(self.home, self.run_id, step, rec.epoch),  # `segue logs`
            # A task sees exactly its own devices (none for a CPU step).
            env={"CUDA_VISIBLE_DEVICES": devices},
            flow_path=self.flow_path,
            resources=self.steps[step].resources, world_size=self.steps[step].world_size,
            # Everything else the worker is told, in one record (run.worker_options); an
            # elastic map step finds its allocation in the pool by it (segue.data.elastic).
            options=WorkerOptions(
                store=self._store_url, host=given_host(), devices=tuple(placed.devices),
                pool=str(self.sched.pool.path), pool_home=self.sched.home, pool_host=self.sched.host,
            ).to_json(),
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
        now = self._now()
        for step, a in list(self.attempts.items()):
            code = a.handle.poll()
            t = by_step[step]
            if code is None:
                # Hung attempt: alive but its heartbeat stopped renewing the lease.
                if (t.state == TaskState.RUNNING and t.epoch == a.epoch and t.lease_until
                        and t.lease_until < now and a.killed_for is None
                        and not a.handle.waiting() and not a.starting(t.pid, self.options.lease_ttl_s)):
                    a.killed_for = "lease"
                    a.handle.kill()
                continue
            # Forgotten only once its end is recorded: if the store cannot be written
            # now, the next reap tries again (a lost exit would leave the task RUNNING).
            if a.outcome is None:
                a.outcome = self._on_exit(a, code, self.store.get_task(self.run_id, step))
            self.sched.released(step, a.epoch, started_wall=a.started_wall, outcome=a.outcome)
            del self.attempts[step]
            exited = True
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
        if code == EXIT_DISK_FULL:
            error, _ = self._describe_exit(a, code)
            self.store.transition_task(
                self.run_id, a.step, TaskState.PARKED, actor=Actor.FAILURE_DETECTOR, epoch=a.epoch,
                reason=f"{error}; parked (not counted as a failure)", error=error,
            )
            self._disk_full = error
            log.warning("run %s: step %s: %s", self.run_id, a.step, error)
            return "parked"
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
        record_failure(self.store, self.home, self.run_id, a.step, a.epoch, error, t.attempts)
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
                reason=f"{error}; retry {failures} of {retries} in {delay:.1f}s"
                + (" (this attempt committed a checkpoint: the count of failures starts over)"
                   if progressed else ""),
                count_failure=True, reset_failures=progressed, error=error,
                next_attempt_at=self._now() + delay,
            )
        else:
            if not retryable:
                self._not_retryable[a.step] = error
            self.store.transition_task(
                self.run_id, a.step, TaskState.FAILED, actor=Actor.FAILURE_DETECTOR, epoch=a.epoch,
                reason=f"{error}; " + (f"retries exhausted ({retries})" if retryable else "not retryable"),
                count_failure=True, reset_failures=progressed, error=error,
            )
        return "killed"

    def _describe_exit(self, a: _Attempt, code: int) -> tuple[str, bool]:
        return describe_exit(self.home, self.run_id, a.step, a.epoch, code, lease_lost=a.killed_for == "lease")
