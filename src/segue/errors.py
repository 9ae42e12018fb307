"""The exception tree of segue, documented in one place.

Every message is one lower-case line that says what is wrong and what to do.
The CLI prints ``str(exc)`` and maps the class to an exit code, so keep
messages self-contained.

    SegueError
    ├── UsageError                 bad input; the CLI exits 2 and nothing was written
    │   ├── FlowError              missing flow file, syntax error, cycle, unknown step
    │   ├── ParamError             unknown parameter or a value of the wrong type
    │   ├── UnknownRunError        no run with that id in this home
    │   ├── RunExistsError         --run-id names a run that already exists
    │   ├── CodeChangedError       resume refused: the flow's code changed
    │   └── IllegalTransitionError a state change the transition table forbids
    ├── ControllerConflictError    another live controller already drives the run
    ├── FencedError                this attempt's epoch was superseded; it must stop
    ├── StoreError                 the metadata store is unusable (schema too new, ...)
    ├── CheckpointError
    │   ├── CheckpointCorruptError a checkpoint failed verification
    │   ├── NoValidCheckpointError committed checkpoints exist but none verifies
    │   └── StateTypeError         state holds a value checkpoints cannot store
    └── InjectedFault              raised by a fault point (tests only)
"""

from __future__ import annotations


class SegueError(Exception):
    """Base class of every error segue raises on purpose."""


class UsageError(SegueError):
    """Bad input from the user. Nothing was written."""


class FlowError(UsageError):
    """The flow file is missing, does not parse, or its DAG is invalid."""


class ParamError(UsageError):
    """A parameter is unknown or its value does not have the declared type."""


class UnknownRunError(UsageError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"unknown run {run_id!r}; `segue ls` lists the runs in this home")
        self.run_id = run_id


class RunExistsError(UsageError):
    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id!r} already exists; pick another --run-id or `segue resume {run_id}`"
        )
        self.run_id = run_id


class CodeChangedError(UsageError):
    """Resume refused because the flow's code changed since the run began."""


class IllegalTransitionError(UsageError):
    def __init__(self, what: str, from_state: str, to_state: str, hint: str = "") -> None:
        msg = f"{what} cannot go from {from_state} to {to_state}"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)
        self.from_state = from_state
        self.to_state = to_state


class ControllerConflictError(SegueError):
    """A second controller tried to drive a run whose controller is alive."""


class FencedError(SegueError):
    """The caller's epoch is no longer current: a newer attempt owns the task."""


class StoreError(SegueError):
    """The metadata store cannot be used as it is."""


class CheckpointError(SegueError):
    """Base class of checkpoint problems."""


class CheckpointCorruptError(CheckpointError):
    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"checkpoint {path} failed verification ({detail})")
        self.path = path
        self.detail = detail


class NoValidCheckpointError(CheckpointError):
    """Committed checkpoints exist, but none of them verifies."""


class StateTypeError(CheckpointError, TypeError):
    """A value in the state tree cannot be stored without pickle."""


class InjectedFault(SegueError):
    """Raised by a fault point armed through SEGUE_FAULTS (tests only)."""
