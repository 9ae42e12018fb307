"""The store's decisions, written once for both backends: pure functions, no I/O.

Which writes are allowed (the state tables of :mod:`segue.states`, a caller's
only-from list, a no-op move), what each one changes in its row, how failures
and attempts are counted, which event it records, whether an epoch still holds
a task or a run (fencing), and lease arithmetic. :mod:`segue.store.sqlite` and
:mod:`segue.store.postgres` fetch and lock rows, call these, and write what they
answer: they hold SQL, locking and retries only.

A write is described as a :class:`Move`: the states it may start from, the
column changes and the event. A change's value is either plain or one of the
expressions below (:class:`Now`, :class:`Old`, :class:`IfFrom`, :class:`Text`),
so one description serves a backend that reads the row first and resolves them
in Python (:func:`resolve_changes`, :func:`resolve_event`) and one that sends it
as a single statement and lets the database resolve them
(:mod:`segue.store.postgres_hot`). Nothing here reads a clock: ``t`` is the
backend's (the database's on PostgreSQL).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._canon import canonical_json
from ..errors import ControllerConflictError, FencedError, IllegalTransitionError, StoreError
from ..flow.model import task_step
from ..states import (
    RESTART_FROM,
    RUN_TRANSITIONS,
    TASK_TRANSITIONS,
    Actor,
    RunState,
    TaskState,
    check_run,
    check_task,
)

CHECKPOINT_STATUSES = frozenset({"committed", "quarantined", "pruned"})

# Task columns a write may set. Column names are formatted into SQL, so they
# must come from this fixed set, never from a caller.
TASK_COLUMNS = frozenset(
    {
        "state", "epoch", "attempts", "failures", "pid", "host", "lease_until",
        "progress_done", "progress_total", "output_ref", "error", "next_attempt_at",
        "started_at", "finished_at", "updated_at",
    }
)
RUN_COLUMNS = frozenset(
    {"state", "options", "updated_at", "controller_epoch", "controller_pid", "controller_host",
     "controller_lease_until"}
)


# -- values a change may take besides a plain one ----------------------------------------------
@dataclass(frozen=True)
class Now:
    """The write's time plus ``plus`` seconds (a lease: ``Now(ttl_s)``)."""

    plus: float = 0.0


@dataclass(frozen=True)
class Old:
    """The row's value of ``col`` before the write, plus ``plus``; ``default`` where it is null."""

    col: str
    plus: int = 0
    default: Any = None


@dataclass(frozen=True)
class IfFrom:
    """``value`` where the row's state before the write is one of ``states``; otherwise
    the column keeps its value."""

    states: frozenset[str]
    value: Any


@dataclass(frozen=True)
class Text:
    """A string made of literal parts and the values above, each written as text."""

    parts: tuple[Any, ...]


def resolve(v: Any, row: Any, t: float) -> Any:
    """A change's value, given the row before the write and the write's time."""
    if isinstance(v, Now):
        return t + v.plus
    if isinstance(v, Old):
        cur = row[v.col]
        if cur is None:
            return resolve(v.default, row, t)
        return cur + v.plus if v.plus else cur
    if isinstance(v, Text):
        return "".join(str(resolve(p, row, t)) for p in v.parts)
    return v


def resolve_changes(changes: Mapping[str, Any], row: Any, t: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col, v in changes.items():
        if isinstance(v, IfFrom):
            if row["state"] not in v.states:
                continue
            v = v.value
        out[col] = resolve(v, row, t)
    return out


def json_text(data: Mapping[str, Any]) -> str | Text:
    """``data``'s canonical JSON; a :class:`Text` where values are expressions (each
    an integer column, written as JSON writes an integer)."""
    marks = {k: f"\x01{i}\x01" for i, (k, v) in enumerate(data.items()) if isinstance(v, (Old, Now))}
    if not marks:
        return canonical_json(dict(data))
    text = canonical_json({k: marks.get(k, v) for k, v in data.items()})
    parts: list[Any] = []
    for k in sorted(marks, key=lambda k: text.find(canonical_json(marks[k]))):
        head, _, text = text.partition(canonical_json(marks[k]))
        parts += [head, data[k]]
    return Text(tuple(p for p in [*parts, text] if p != ""))


# -- events ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EventDraft:
    """An event a write records; its fields may hold the expressions above."""

    kind: str
    actor: str
    reason: Any
    step: str | None = None
    from_state: Any = None
    to_state: Any = None
    data: Mapping[str, Any] = field(default_factory=dict)


def event_args(ev: EventDraft, row: Any, t: float) -> dict[str, Any]:
    """The keyword arguments of a backend's ``insert_event`` for ``ev``."""
    return {"kind": ev.kind, "actor": ev.actor, "reason": resolve(ev.reason, row, t), "t": t,
            "step": ev.step, "from_state": resolve(ev.from_state, row, t),
            "to_state": resolve(ev.to_state, row, t),
            "data": {k: resolve(v, row, t) for k, v in ev.data.items()}}


# -- moves ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Move:
    """One write: allowed from ``sources`` (state values), it applies ``changes`` and
    records ``event``. ``check(cur)`` raises the error for a state outside ``sources``."""

    what: str  # "a task" or "a run"
    to: str
    sources: frozenset[str]
    changes: Mapping[str, Any]
    event: EventDraft
    only_from: frozenset[str] | None = None
    restart: bool = False  # the operator's restart of a path: states.RESTART_FROM, not the table

    def check(self, cur: str) -> None:
        """IllegalTransitionError unless the move may start from ``cur``."""
        if self.restart:
            if cur not in self.sources:
                raise IllegalTransitionError(self.what, cur, self.to, "a restarted path leaves only "
                                             + ", ".join(sorted(self.sources)))
        elif self.what == "a task":
            check_task(TaskState(cur), TaskState(self.to))
        else:
            check_run(RunState(cur), RunState(self.to))
        if self.only_from is not None and cur not in self.only_from:
            allowed = ", ".join(sorted(self.only_from))
            raise IllegalTransitionError(
                self.what, cur, self.to, f"this change is only allowed from {allowed}")


def _only(states: Collection[Any] | None, enum: Any) -> frozenset[str] | None:
    return None if states is None else frozenset(enum(s).value for s in states)


def no_running_without_attempt(run_id: str, step: str) -> ValueError:
    # A RUNNING task without a new epoch would let the previous attempt's zombie
    # write again: fencing needs start_attempt.
    return ValueError(
        f"step {step!r} in run {run_id!r}: use start_attempt to move a task to RUNNING; "
        "it raises the epoch that fences older attempts")


# Leaving RUNNING drops the attempt's claim on the task.
NO_ATTEMPT: dict[str, Any] = {"pid": None, "host": None, "lease_until": None}
_FROM_RUNNING = frozenset({TaskState.RUNNING.value})


def task_move(run_id: str, step: str, to: TaskState, *, actor: str, reason: str,
              only_from: Collection[TaskState] | None = None, count_failure: bool = False,
              error: str | None = None, next_attempt_at: float | None = None,
              reset_failures: bool = False) -> Move:
    """``transition_task``: any legal move but to RUNNING (that is :func:`start_move`)."""
    to = TaskState(to)
    if to == TaskState.RUNNING:
        raise no_running_without_attempt(run_id, step)
    only = _only(only_from, TaskState)
    sources = frozenset(s.value for s in TaskState
                        if to in TASK_TRANSITIONS[s] and (only is None or s.value in only))
    bump = 1 if count_failure else 0
    changes: dict[str, Any] = {
        "state": to.value,
        "failures": bump if reset_failures else Old("failures", plus=bump),
        # The backoff deadline only means something while RETRYING.
        "next_attempt_at": next_attempt_at if to == TaskState.RETRYING else None,
        "finished_at": Now() if to.done else None,
        "updated_at": Now(),
    }
    if error is not None:
        changes["error"] = error
    changes.update({c: IfFrom(_FROM_RUNNING, v) for c, v in NO_ATTEMPT.items()})
    data: dict[str, Any] = {"epoch": Old("epoch")}
    if error is not None:
        data["error"] = error
    return Move("a task", to.value, sources, changes,
                EventDraft("task", str(actor), reason, step, Old("state"), to.value, data), only)


def start_move(step: str, *, ttl_s: float, actor: str,
               data: Mapping[str, Any] | None = None) -> Move:
    """``start_attempt``: RUNNING under the next epoch, with a lease of ``ttl_s``."""
    to = TaskState.RUNNING
    sources = frozenset(s.value for s in TaskState if to in TASK_TRANSITIONS[s])
    epoch, attempts = Old("epoch", plus=1), Old("attempts", plus=1)
    changes = {
        "state": to.value, "epoch": epoch, "attempts": attempts, "pid": None, "host": None,
        "lease_until": Now(float(ttl_s)), "next_attempt_at": None,
        "started_at": Old("started_at", default=Now()), "finished_at": None, "updated_at": Now(),
    }
    event = EventDraft("task", str(actor), Text(("attempt ", attempts, " started")), step,
                       Old("state"), to.value, {"epoch": epoch, "attempt": attempts, **dict(data or {})})
    return Move("a task", to.value, sources, changes, event)


def complete_move(step: str, *, epoch: int, output_ref: str | None, actor: str) -> Move:
    """``complete_task``: SUCCEEDED with its output (the table allows it only from RUNNING)."""
    to = TaskState.SUCCEEDED
    sources = frozenset(s.value for s in TaskState if to in TASK_TRANSITIONS[s])
    changes = {"state": to.value, "output_ref": output_ref, "next_attempt_at": None,
               "finished_at": Now(), "updated_at": Now(), **NO_ATTEMPT}
    return Move("a task", to.value, sources, changes,
                EventDraft("task", str(actor), "output committed", step, Old("state"), to.value,
                           {"epoch": epoch, "output_ref": output_ref}))


def run_move(to: RunState, *, actor: str, reason: str,
             only_from: Collection[RunState] | None = None) -> Move:
    """``transition_run``. A run already in ``to`` is a no-op (not in ``sources``, and
    not refused: see :func:`is_noop`)."""
    to = RunState(to)
    only = _only(only_from, RunState)
    sources = frozenset(s.value for s in RunState if s != to and to in RUN_TRANSITIONS[s]
                        and (only is None or s.value in only))
    return Move("a run", to.value, sources, {"state": to.value, "updated_at": Now()},
                EventDraft("run", str(actor), reason, None, Old("state"), to.value), only)


def is_noop(move: Move, cur: str) -> bool:
    return move.what == "a run" and cur == move.to


# -- fencing -------------------------------------------------------------------------------------
def fenced(msg: str, *, run_id: str, step: str | None, actor: str, epoch: int,
           current: int) -> FencedError:
    """A FencedError carrying what the store records about the refusal (a ``fenced`` event)."""
    err = FencedError(msg)
    err.fence = {  # type: ignore[attr-defined]
        "run_id": run_id, "step": step, "actor": actor, "epoch": epoch, "current": current,
    }
    return err


def check_epoch(run_id: str, step: str, row: Any, epoch: int, *, need_running: bool = False) -> None:
    """FencedError unless attempt ``epoch`` still holds the task (and, with
    ``need_running``, the task is still RUNNING)."""
    cur = int(row["epoch"])
    if cur != epoch:
        raise fenced(
            f"attempt epoch {epoch} of step {step!r} in run {run_id!r} was superseded by "
            f"epoch {cur}; this attempt must stop",
            run_id=run_id, step=step, actor=Actor.WORKER, epoch=epoch, current=cur,
        )
    if need_running and row["state"] != TaskState.RUNNING.value:
        # Someone (pause deadline, failure detector) took the task from this
        # attempt without starting a new one; it must not re-claim a lease.
        raise fenced(
            f"attempt epoch {epoch} of step {step!r} in run {run_id!r} no longer holds "
            f"the task (now {row['state']}); this attempt must stop",
            run_id=run_id, step=step, actor=Actor.WORKER, epoch=epoch, current=cur,
        )


def check_controller_epoch(run_id: str, row: Any, epoch: int) -> None:
    cur = int(row["controller_epoch"])
    if cur != epoch:
        raise fenced(
            f"controller epoch {epoch} of run {run_id!r} was superseded by epoch {cur}; "
            "this controller must stop",
            run_id=run_id, step=None, actor=Actor.CONTROLLER, epoch=epoch, current=cur,
        )


def check_handover(run_id: str, row: Any, expect_epoch: int) -> None:
    """A hand-over of the controller lease goes through only if nobody took it since the claim."""
    cur = int(row["controller_epoch"])
    if cur != expect_epoch:
        raise ControllerConflictError(
            f"run {run_id!r} was claimed with controller epoch {expect_epoch}, but epoch {cur} "
            f"(pid {row['controller_pid']} on host {row['controller_host']}) took it since; "
            "this controller stands down")


# -- leases ---------------------------------------------------------------------------------------
def fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def lease_live(lease_until: float | None, t: float) -> bool:
    """Whether a lease that runs until ``lease_until`` still holds at ``t``."""
    return lease_until is not None and lease_until > t


@dataclass(frozen=True)
class Claim:
    """A controller's new lease: its epoch, the run's changes and the event."""

    epoch: int
    changes: dict[str, Any]
    event: EventDraft


def claim_controller(run_id: str, row: Any, t: float, *, pid: int, host: str, ttl_s: float,
                     steal: bool, expect_epoch: int | None) -> Claim:
    """``acquire_controller`` at ``t``; a refusal while another controller's lease is live
    (unless stolen, or handed over from ``expect_epoch``)."""
    lease = row["controller_lease_until"]
    live = lease_live(lease, t)
    if expect_epoch is not None:
        check_handover(run_id, row, expect_epoch)
    elif live and not steal:
        raise ControllerConflictError(
            f"run {run_id!r} is already driven by a live controller "
            f"(pid {row['controller_pid']} on host {row['controller_host']}, "
            f"lease until {fmt_time(lease)}); wait for it, pause the run, "
            "or stop that process")
    epoch = int(row["controller_epoch"]) + 1
    changes = {"controller_epoch": epoch, "controller_pid": pid, "controller_host": host,
               "controller_lease_until": t + ttl_s, "updated_at": t}
    data: dict[str, Any] = {"epoch": epoch, "pid": pid, "host": host, "lease_until": t + ttl_s}
    if live:
        data["stolen_from"] = {"epoch": row["controller_epoch"], "pid": row["controller_pid"],
                               "host": row["controller_host"]}
    reason = "controller lease stolen" if live else "controller lease acquired"
    return Claim(epoch, changes, EventDraft("controller", Actor.CONTROLLER, reason, data=data))


def renew_changes(ttl_s: float) -> dict[str, Any]:
    return {"controller_lease_until": Now(float(ttl_s)), "updated_at": Now()}


RELEASE_CONTROLLER: dict[str, Any] = {"controller_pid": None, "controller_host": None,
                                      "controller_lease_until": None, "updated_at": Now()}


def releases(row: Any, epoch: int) -> EventDraft | None:
    """``release_controller``'s event, or None: superseded or already released, nothing
    of this controller's to give up."""
    if row["controller_epoch"] != epoch or row["controller_lease_until"] is None:
        return None
    return EventDraft("controller", Actor.CONTROLLER, "controller lease released",
                      data={"epoch": epoch})


# -- checkpoints ----------------------------------------------------------------------------------
def check_seq(run_id: str, step: str, seq: int, newest: int | None) -> None:
    if newest is not None and seq <= newest:
        raise StoreError(
            f"checkpoint seq {seq} of step {step!r} in run {run_id!r} does not exceed "
            f"the newest recorded seq {newest}; each checkpoint needs a larger seq")


def checkpoint_event(task: Any, step: str, *, seq: int, epoch: int, path: str, position: Any,
                     nbytes: int, duration_s: float | None) -> EventDraft:
    """The event of a committed checkpoint. It carries the step's reported progress as of
    the commit, for the UI's chart (a position is the step's own, not progress)."""
    data: dict[str, Any] = {"seq": seq, "epoch": epoch, "path": path, "position": position,
                            "nbytes": nbytes}
    if duration_s is not None:
        data["duration_s"] = duration_s
    if task["progress_done"] is not None:
        data["progress"] = {"done": task["progress_done"], "total": task["progress_total"]}
    return EventDraft("checkpoint", Actor.WORKER, f"checkpoint {seq} committed", step, data=data)


def check_checkpoint_status(status: str) -> None:
    if status not in CHECKPOINT_STATUSES:
        raise ValueError(
            f"checkpoint status must be one of {sorted(CHECKPOINT_STATUSES)}, not {status!r}")


# -- decisions of the run's path ----------------------------------------------------------------
def skip_move(run_id: str, step: str, *, actor: str, reason: str) -> Move:
    """A PENDING task that a decision leaves out (``record_decision``)."""
    return task_move(run_id, step, TaskState.SKIPPED, actor=actor, reason=reason,
                     only_from=(TaskState.PENDING,))


def decision_event(step: str, *, actor: str, reason: str, add: Sequence[str], skip: Sequence[str],
                   data: Mapping[str, Any] | None) -> EventDraft:
    """The ``decision`` event: what was decided, with the tasks it created (their count,
    and the names only when few) and those it skipped."""
    info: dict[str, Any] = {**dict(data or {}), "added": len(add), "skipped": list(skip)}
    if len(add) <= 16:
        info["tasks"] = list(add)
    return EventDraft("decision", str(actor), reason, step, None, None, info)


def restart_moves(run_id: str, name: str, *, actor: str, reason: str) -> Move:
    """A task of a path started over: back to PENDING from wherever it is (states.RESTART_FROM).
    RUNNING too: the resume that asks runs only once no controller lives, and an attempt left
    RUNNING died with it (its epoch is fenced by the next attempt's)."""
    to = TaskState.PENDING.value
    changes: dict[str, Any] = {"state": to, "failures": 0, "error": None, "next_attempt_at": None,
                               "finished_at": None, "updated_at": Now(),
                               **{c: IfFrom(_FROM_RUNNING, v) for c, v in NO_ATTEMPT.items()}}
    return Move("a task", to, frozenset(s.value for s in RESTART_FROM), changes,
                EventDraft("task", str(actor), reason, name, Old("state"), to, {"epoch": Old("epoch")}),
                restart=True)


def discarded(floor: int) -> dict[str, Any]:
    """The ``restart-step`` event's data: restores ignore checkpoints at or below ``floor``."""
    return {"discarded_through_seq": int(floor)}


def raise_floor(floors: dict[str, int], task: str, epoch: int) -> None:
    """``floors[group]``: the highest epoch of the dropped tasks of a group (``NAME.K``)."""
    group = task_step(task)[0]
    floors[group] = max(floors.get(group, 0), int(epoch))
