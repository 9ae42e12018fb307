"""The metadata store contract: what every backend (SQLite now, PostgreSQL later) provides.

The store is the only place where committed metadata lives (invariant 1). Every
method is one atomic transaction. Methods that take an ``epoch`` are *fenced*:
they change nothing and raise :class:`~segue.errors.FencedError` unless the
task's current epoch equals the one given, so a zombie attempt can never
overwrite newer progress (invariant 2). The refusal itself is recorded as a
``fenced`` event (its own transaction), so every zombie write is visible. State changes are validated against
:mod:`segue.states` inside the transaction and each one appends an event.

A store must be rebuildable in another process from its constructor arguments
(workers open their own), and it must be safe to use from several processes.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..states import RunState, TaskState

if TYPE_CHECKING:
    from .schedules_rows import NewSchedule, ScheduleRecord

Clock = Callable[[], float]

CLOCK_FILE_ENV = "SEGUE_CLOCK_FILE"
SKEW_ENV = "SEGUE_CLOCK_SKEW_S"  # fault injection: this host's wall clock is off by N seconds


def now() -> float:
    """Wall-clock seconds. Leases compare wall-clock times across processes.

    For tests only, ``SEGUE_CLOCK_FILE`` names a file holding a number of
    seconds to add. Every process of a run (CLI, controller, workers) inherits
    the variable and reads the same file, so a test moves time forward for all
    of them at once instead of sleeping against a lease on a loaded machine.
    ``SEGUE_CLOCK_SKEW_S`` (also for tests) makes one host's clock wrong:
    a store with its own clock (PostgreSQL) must judge leases by that one, so
    a skewed host can neither steal a live lease nor keep a dead one.
    """
    path = os.environ.get(CLOCK_FILE_ENV)
    return wall_clock() + (_clock_offset(path) if path else 0.0)


def wall_clock() -> float:
    """This host's wall clock: ``time.time()``, off by ``$SEGUE_CLOCK_SKEW_S`` in tests."""
    skew = os.environ.get(SKEW_ENV)
    return time.time() + (float(skew) if skew else 0.0)


def _clock_offset(path: str) -> float:
    try:
        with open(path) as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 0.0
    # A test rewrites the file atomically (os.replace), so a torn read is impossible.
    return float(text) if text else 0.0


@dataclass(frozen=True)
class NewRun:
    """What the caller supplies to create a run."""

    run_id: str
    flow_name: str
    flow_path: str
    params: dict[str, Any]
    fingerprint: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    flow_name: str
    flow_path: str
    params: dict[str, Any]
    fingerprint: dict[str, Any]
    options: dict[str, Any]
    state: RunState
    created_at: float
    updated_at: float
    controller_epoch: int  # rises with every acquire_controller
    controller_pid: int | None
    controller_host: str | None
    controller_lease_until: float | None  # None: no controller holds the run

    def controller_alive(self, at: float | None = None) -> bool:
        t = now() if at is None else at
        return self.controller_lease_until is not None and self.controller_lease_until > t


@dataclass(frozen=True)
class TaskRecord:
    run_id: str
    step: str
    state: TaskState
    epoch: int  # fencing token; rises with every start_attempt
    attempts: int  # attempts started, ever
    failures: int  # failed attempts counted against the step's retries
    pid: int | None
    host: str | None
    lease_until: float | None
    progress_done: float | None
    progress_total: float | None
    output_ref: str | None  # where the committed output lives, once SUCCEEDED
    error: str | None  # last error message, if any
    next_attempt_at: float | None  # backoff deadline while RETRYING
    started_at: float | None  # first attempt start
    finished_at: float | None
    updated_at: float


@dataclass(frozen=True)
class CheckpointRecord:
    run_id: str
    step: str
    seq: int  # rises per task; the newest committed checkpoint has the largest seq
    epoch: int  # epoch of the attempt that committed it
    path: str  # storage-relative directory of the checkpoint
    created_at: float
    position: Any  # JSON: what the step says it had reached (e.g. {"step": 1200})
    nbytes: int
    status: str  # "committed" | "quarantined" | "pruned"


@dataclass(frozen=True)
class Event:
    id: int  # strictly increasing per store
    run_id: str
    step: str | None
    time: float
    actor: str
    kind: str  # "run" | "task" | "checkpoint" | "controller" | "warning" | free-form
    from_state: str | None
    to_state: str | None
    reason: str
    data: dict[str, Any]


@dataclass(frozen=True)
class MetricPoint:
    """One value a step logged with ``ctx.log_metrics``; a point is keyed by
    (run_id, step, name, index), so a redone step replaces its point, never adds one."""

    run_id: str
    step: str  # the flow step that logged it
    name: str  # the metric ("loss")
    index: int  # the step's own counter: ``log_metrics(step=...)``
    value: float | None  # None: the step logged NaN or an infinity
    epoch: int  # the attempt that wrote it last
    time: float  # when it was written (the store's clock)


@dataclass(frozen=True)
class Heartbeat:
    """Reply to a worker's heartbeat: the run state tells it whether to park."""

    run_state: RunState
    lease_until: float


@dataclass(frozen=True)
class HostRecord:
    """A host that runs a ``segue agent``, as registered in the store."""

    host: str
    epoch: int  # rises with every agent that registers the host (fencing token)
    pid: int | None  # the agent's
    info: dict[str, Any]  # what the agent reported: devices, cpus, memory, version
    started_at: float  # when this epoch's agent registered
    seen_at: float  # its last heartbeat
    lease_until: float | None  # None: the agent stopped cleanly

    def alive(self, at: float) -> bool:
        return self.lease_until is not None and self.lease_until > at


class Store(ABC):
    """Abstract metadata store. See the module docstring for the guarantees."""

    # -- lifecycle -----------------------------------------------------------
    @abstractmethod
    def close(self) -> None: ...

    def wait_for_change(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking early when a run of this store may
        have changed (PostgreSQL: LISTEN/NOTIFY). True if woken by a change. A hint
        only: callers poll on every return, whatever it says."""
        time.sleep(max(0.0, timeout))
        return False

    def now(self) -> float:
        """The clock this store stamps leases with, in epoch seconds. Every lease
        judgement outside the store (is a controller or an attempt still alive)
        must read this, never the caller's own clock: on a shared store the
        hosts' clocks differ."""
        return now()

    # -- runs ----------------------------------------------------------------
    @abstractmethod
    def create_run(self, run: NewRun, steps: Sequence[str], *, actor: str) -> RunRecord:
        """Insert the run (PENDING) and one PENDING task per step, plus a creation event.

        Raises RunExistsError if the id is taken.
        """

    @abstractmethod
    def get_run(self, run_id: str) -> RunRecord:
        """Raises UnknownRunError."""

    @abstractmethod
    def list_runs(self, *, states: Collection[RunState] | None = None, flow: str | None = None,
                  limit: int | None = None, offset: int = 0) -> list[RunRecord]:
        """Runs, newest first: those in ``states`` (all if None) of ``flow`` (all if
        None), ``limit`` of them (all if None) after skipping ``offset``."""

    def run_counts(self) -> dict[tuple[RunState, str], int]:
        """How many runs there are per (state, flow name): a listing's filter counts
        without reading every record. Backends answer it with one aggregate query."""
        out: dict[tuple[RunState, str], int] = {}
        for r in self.list_runs():
            out[(r.state, r.flow_name)] = out.get((r.state, r.flow_name), 0) + 1
        return out

    @abstractmethod
    def set_run_options(self, run_id: str, options: dict[str, Any], *, actor: str, reason: str) -> RunRecord:
        """Replace the run's stored options (an operator's change at resume), with an event."""

    @abstractmethod
    def transition_run(
        self,
        run_id: str,
        to: RunState,
        *,
        actor: str,
        reason: str,
        only_from: Collection[RunState] | None = None,
        controller_epoch: int | None = None,
    ) -> RunRecord:
        """Move the run to ``to`` and append an event.

        The table in segue.states is checked first (IllegalTransitionError).
        ``only_from`` narrows the allowed source states further (also
        IllegalTransitionError). With ``controller_epoch`` the change is fenced
        on the controller epoch (FencedError). A transition to the same state is
        a no-op that returns the record and writes nothing.
        """

    # -- controller lease ------------------------------------------------------
    @abstractmethod
    def acquire_controller(
        self, run_id: str, *, pid: int, host: str, ttl_s: float, steal: bool = False,
        expect_epoch: int | None = None,
    ) -> int:
        """Become the run's controller; returns the new controller epoch.

        Raises ControllerConflictError while another controller's lease is live,
        unless ``steal`` is true (the caller has proved that holder dead).
        ``expect_epoch``: a hand-over. Take the lease, live or not, only if the
        controller epoch is still that one (a host agent claimed the run with it
        and started this controller); ControllerConflictError otherwise. The
        judgement and the write are one transaction (the run's row lock on
        PostgreSQL), so of two claimants exactly one wins.
        """

    @abstractmethod
    def renew_controller(self, run_id: str, epoch: int, ttl_s: float) -> RunRecord:
        """Extend the lease; FencedError if another controller took over."""

    @abstractmethod
    def release_controller(self, run_id: str, epoch: int) -> None:
        """Give the lease up (no-op if already superseded)."""

    # -- hosts (segue agent) ---------------------------------------------------
    @abstractmethod
    def register_host(self, host: str, *, pid: int, info: dict[str, Any], ttl_s: float,
                      steal: bool = False) -> int:
        """Register ``host``'s agent with a lease; returns its new agent epoch.

        ControllerConflictError while another agent of the same host name holds
        a live lease (judged by the store's clock), unless ``steal`` (the caller
        proved that agent dead: its pid is gone on this host)."""

    @abstractmethod
    def renew_host(self, host: str, epoch: int, ttl_s: float,
                   info: dict[str, Any] | None = None) -> HostRecord:
        """Extend the agent's lease (and replace its info); FencedError if another
        agent registered the host since."""

    @abstractmethod
    def release_host(self, host: str, epoch: int) -> None:
        """The agent stops: its lease ends now (no-op if superseded)."""

    @abstractmethod
    def list_hosts(self) -> list[HostRecord]:
        """Every host ever registered, by name; ``alive(store.now())`` tells the live ones."""

    # -- schedules (segue schedule; records in .schedules_rows) ------------------
    @abstractmethod
    def add_schedule(self, schedule: NewSchedule, *, actor: str) -> ScheduleRecord:
        """Insert a schedule (not paused, no slot fired yet), created now by the store's
        clock. UsageError if the name is taken."""

    @abstractmethod
    def get_schedule(self, name: str) -> ScheduleRecord:
        """NotFoundError for an unknown name."""

    @abstractmethod
    def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule, by name."""

    @abstractmethod
    def set_schedule_paused(self, name: str, paused: bool, *, actor: str) -> ScheduleRecord:
        """Pause or unpause a schedule (NotFoundError)."""

    @abstractmethod
    def remove_schedule(self, name: str, *, actor: str) -> None:
        """Remove a schedule (NotFoundError); the runs it created stay."""

    @abstractmethod
    def fire_slot(self, name: str, slot: float, run: NewRun, steps: Sequence[str], *,
                  actor: str) -> RunRecord | None:
        """Create ``run`` (PENDING, one task per step, a creation event naming the
        schedule) as the run of ``slot`` and make ``slot`` the schedule's last slot, in
        one transaction, only if the schedule is not paused and ``slot`` is newer than
        its last slot; None otherwise (already fired or skipped, by any agent: nothing
        is created). NotFoundError for an unknown schedule."""

    @abstractmethod
    def skip_slot(self, name: str, slot: float, *, actor: str, reason: str,
                  run_id: str | None = None, error: str | None = None) -> bool:
        """Make ``slot`` the schedule's last slot without a run, under the same fence as
        :meth:`fire_slot` (False: taken already, or paused); ``error`` is kept as the
        schedule's last error, and ``reason`` becomes a ``schedule`` event of ``run_id``
        (the run still going, if given)."""

    # -- tasks ---------------------------------------------------------------
    @abstractmethod
    def get_tasks(self, run_id: str) -> list[TaskRecord]:
        """The run's tasks in the order their steps were given to create_run."""

    @abstractmethod
    def get_task(self, run_id: str, step: str) -> TaskRecord: ...

    @abstractmethod
    def transition_task(
        self,
        run_id: str,
        step: str,
        to: TaskState,
        *,
        actor: str,
        reason: str,
        epoch: int | None = None,
        only_from: Collection[TaskState] | None = None,
        count_failure: bool = False,
        error: str | None = None,
        next_attempt_at: float | None = None,
        reset_failures: bool = False,
    ) -> TaskRecord:
        """Move a task, append an event. Fenced when ``epoch`` is given.

        ``count_failure`` adds one to ``failures``; ``reset_failures`` zeroes it
        (resume of a FAILED run). Leaving RUNNING clears pid and lease.
        """

    @abstractmethod
    def record_decision(self, run_id: str, step: str, *, controller_epoch: int, actor: str, reason: str,
                        add: Sequence[str] = (), skip: Sequence[str] = (),
                        data: Mapping[str, Any] | None = None, epoch: int = 0) -> bool:
        """Record a choice of the run's path, in one transaction fenced by the controller's
        epoch: create the tasks ``add`` (PENDING, after the others, at ``epoch``: above every
        epoch tasks of those names had before a restart dropped them), move those of ``skip``
        still PENDING to SKIPPED, and append a ``decision`` event of ``step``.

        Returns False, writing nothing, when it was recorded already (the first task of
        ``add`` exists): a controller that took over re-decides nothing.
        """

    @abstractmethod
    def restart_path(self, run_id: str, step: str, *, reset: Sequence[str], drop: Sequence[str],
                     actor: str, reason: str) -> None:
        """Start a decided path over (`segue resume --restart-step STEP`), in one transaction:
        delete the tasks ``drop`` (a fan-out's items, a loop's iterations: the next decision
        creates them anew), move each task of ``reset`` back to PENDING (failures zeroed)
        with a ``restart-step`` event discarding its checkpoints (their committed rows
        pruned), and append ``step``'s ``restart-path`` event, whose ``floors`` give each
        group the highest epoch its dropped tasks had (their successors start above it).
        """

    @abstractmethod
    def start_attempt(self, run_id: str, step: str, *, ttl_s: float, actor: str) -> TaskRecord:
        """Begin a new attempt: epoch += 1, attempts += 1, state RUNNING, lease set.

        Allowed from PENDING or RETRYING. The returned record carries the new
        epoch, which the attempt must pass to every later call.
        """

    @abstractmethod
    def set_attempt_pid(self, run_id: str, step: str, epoch: int, pid: int, host: str) -> None:
        """Record the attempt's process (fenced)."""

    @abstractmethod
    def heartbeat(self, run_id: str, step: str, epoch: int, ttl_s: float) -> Heartbeat:
        """Extend the attempt's lease (fenced) and report the run's state."""

    @abstractmethod
    def report_progress(
        self, run_id: str, step: str, epoch: int, done: float, total: float | None
    ) -> None:
        """Store progress (fenced)."""

    @abstractmethod
    def commit_checkpoint(
        self,
        run_id: str,
        step: str,
        epoch: int,
        *,
        seq: int,
        path: str,
        position: Any,
        nbytes: int,
        duration_s: float | None = None,
    ) -> CheckpointRecord:
        """Record a checkpoint whose manifest is already durable (fenced).

        ``seq`` must exceed every seq recorded for the task, else StoreError.
        ``duration_s`` (how long the save took, from the step's call to the
        durable manifest) goes into the commit event's data, for /metrics.
        """

    @abstractmethod
    def list_checkpoints(
        self, run_id: str, step: str | None = None, *, statuses: Collection[str] = ("committed",)
    ) -> list[CheckpointRecord]:
        """Checkpoints of a run (or one step), newest first per step."""

    @abstractmethod
    def set_checkpoint_status(
        self, run_id: str, step: str, seq: int, status: str, *, actor: str, reason: str
    ) -> None:
        """Mark a checkpoint quarantined or pruned, with an event."""

    @abstractmethod
    def complete_task(
        self, run_id: str, step: str, epoch: int, *, output_ref: str | None, actor: str
    ) -> TaskRecord:
        """RUNNING -> SUCCEEDED with the output reference, in one fenced transaction."""

    # -- step metrics (ctx.log_metrics) ------------------------------------------
    @abstractmethod
    def put_metrics(self, run_id: str, step: str, points: Sequence[tuple[str, int, float | None]],
                    *, epoch: int) -> int:
        """Upsert ``points`` ((name, index, value) each) of the step, fenced on
        ``epoch``, in one transaction; returns how many were written. A point already
        stored under the same (name, index) is replaced (a resumed attempt redoing a
        step), and the newest point per name becomes its flow's latest value (the
        /metrics gauge). Values must be finite or None (the caller maps NaN and
        infinities to None); names are checked by the caller (``ctx.log_metrics``)."""

    @abstractmethod
    def get_metrics(self, run_id: str, step: str | None = None, *,
                    since: float | None = None) -> list[MetricPoint]:
        """The run's metric points (of one step if given; written after ``since``, a
        store time, if given), in step order, then by name and index. UnknownRunError,
        or StoreError for a step the run does not have."""

    # -- events --------------------------------------------------------------
    @abstractmethod
    def append_event(
        self,
        run_id: str,
        kind: str,
        *,
        actor: str,
        reason: str,
        step: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> Event: ...

    @abstractmethod
    def list_events(self, run_id: str, *, after_id: int = 0,
                    kinds: Collection[str] | None = None) -> list[Event]:
        """Events of a run in order (ids ascending), those with id > after_id, of the
        given ``kinds`` only (all if None): a reader of run transitions need not read
        the thousands of checkpoint events of a long run."""
