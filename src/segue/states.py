"""Run and task state machines: the enums and their transition tables.

This module is the single source of truth for which state changes are legal.
Stores call :func:`check_run` / :func:`check_task` inside the same transaction
that writes the new state, so an illegal change never reaches storage.
"""

from __future__ import annotations

from enum import StrEnum

from .errors import IllegalTransitionError


class RunState(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def finished(self) -> bool:
        return self in (RunState.SUCCEEDED, RunState.CANCELLED)


class TaskState(StrEnum):
    PENDING = "PENDING"  # waiting for its upstream steps or for a controller
    RUNNING = "RUNNING"  # an attempt holds the lease
    RETRYING = "RETRYING"  # the last attempt failed; the next waits for its backoff
    PARKED = "PARKED"  # paused at a checkpoint (or killed at the pause deadline)
    SUCCEEDED = "SUCCEEDED"  # output committed; never runs again
    FAILED = "FAILED"  # retries exhausted
    CANCELLED = "CANCELLED"
    SKIPPED = "SKIPPED"  # a branch not taken, or every step it runs after was skipped

    @property
    def done(self) -> bool:
        return self in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.SKIPPED)

    @property
    def settled(self) -> bool:
        """Nothing more will run for it: the steps after it may go (a run succeeds once
        every task is settled)."""
        return self in (TaskState.SUCCEEDED, TaskState.SKIPPED)


class Actor(StrEnum):
    """Who caused a transition; recorded with every event."""

    CLI = "cli"
    API = "api"
    CONTROLLER = "controller"
    SCHEDULER = "scheduler"
    WORKER = "worker"
    FAILURE_DETECTOR = "failure-detector"


R = RunState
RUN_TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    R.PENDING: frozenset({R.RUNNING, R.PAUSED, R.CANCELLED}),
    R.RUNNING: frozenset({R.PAUSING, R.PAUSED, R.SUCCEEDED, R.FAILED, R.CANCELLED}),
    # PAUSING -> RUNNING: a resume that arrives before every task parked, or a
    # controller takeover after the pausing controller died.
    R.PAUSING: frozenset({R.PAUSED, R.RUNNING, R.SUCCEEDED, R.FAILED, R.CANCELLED}),
    R.PAUSED: frozenset({R.RUNNING, R.CANCELLED}),
    R.FAILED: frozenset({R.RUNNING, R.CANCELLED}),
    R.SUCCEEDED: frozenset(),
    R.CANCELLED: frozenset(),
}

T = TaskState
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    # PENDING -> SKIPPED: a decision recorded in the store (a branch not taken), never
    # a worker's doing.
    T.PENDING: frozenset({T.RUNNING, T.CANCELLED, T.SKIPPED}),
    # RUNNING -> PENDING: the attempt was lost with its controller; it is not
    # the step's fault, so it does not count against the step's retries.
    T.RUNNING: frozenset(
        {T.SUCCEEDED, T.PARKED, T.RETRYING, T.FAILED, T.CANCELLED, T.PENDING}
    ),
    T.RETRYING: frozenset({T.RUNNING, T.PARKED, T.FAILED, T.CANCELLED, T.PENDING}),
    T.PARKED: frozenset({T.PENDING, T.CANCELLED}),
    T.FAILED: frozenset({T.PENDING, T.CANCELLED}),
    T.SUCCEEDED: frozenset(),
    T.CANCELLED: frozenset(),
    T.SKIPPED: frozenset(),
}

# The one way out of SUCCEEDED and SKIPPED: the operator starts a path over (`segue
# resume --restart-step STEP` of a step that succeeded, run/restart.py), and that step
# and every step after it go back to PENDING from wherever they are. No other write
# may make this move (Store.restart_path alone uses it).
RESTART_FROM: frozenset[TaskState] = frozenset(
    {T.SUCCEEDED, T.SKIPPED, T.FAILED, T.PARKED, T.RETRYING, T.RUNNING, T.CANCELLED})

_RUN_HINTS = {
    (R.SUCCEEDED, R.PAUSING): "the run already finished",
    (R.CANCELLED, R.PAUSING): "the run already finished",
    (R.FAILED, R.PAUSING): "the run already stopped; `segue resume` restarts it",
    (R.PAUSED, R.PAUSING): "the run is already paused",
    (R.SUCCEEDED, R.RUNNING): "the run already succeeded; start a new run instead",
    (R.CANCELLED, R.RUNNING): "the run was cancelled; start a new run instead",
}


def check_run(from_state: RunState, to_state: RunState) -> None:
    """Raise IllegalTransitionError unless the run may go from one state to the other."""
    if to_state not in RUN_TRANSITIONS[from_state]:
        hint = _RUN_HINTS.get((from_state, to_state), "")
        raise IllegalTransitionError("a run", from_state.value, to_state.value, hint)


def check_task(from_state: TaskState, to_state: TaskState) -> None:
    """Raise IllegalTransitionError unless the task may go from one state to the other."""
    if to_state not in TASK_TRANSITIONS[from_state]:
        raise IllegalTransitionError("a task", from_state.value, to_state.value)
