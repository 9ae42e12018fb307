"""The exception tree of segue, documented in one place.

Every message is one lower-case line that says what is wrong and what to do.
The CLI prints ``str(exc)`` and maps the class to an exit code (right
column), so keep messages self-contained. There is one tree: the data-step
errors (also importable from ``segue.data.errors``) and the checkpoint
format errors live here too.

    SegueError                          exit
    ├── UsageError                        2  bad input, or a command the run refuses as it is;
    │   │                                    nothing was written
    │   ├── FlowError                     2  missing flow file, syntax error, cycle, bad declaration
    │   ├── ParamError                    2  unknown parameter or a value of the wrong type
    │   ├── UnknownRunError               2  no run with that id in this home
    │   ├── NotFoundError                 2  no step, attempt or token of that name (HTTP 404)
    │   ├── RunExistsError                2  --run-id names a run that already exists
    │   ├── CodeChangedError              2  resume refused: the flow's code changed
    │   ├── RunStateError                 2  the run's state refuses the command (resume a
    │   │                                    succeeded run, pause a finished one)
    │   ├── ControllerConflictError       2  another live controller already drives the run
    │   └── PermissionDeniedError         2  a server refused the token (none, unknown, or its
    │                                        role or priority classes do not allow the request)
    ├── ConflictError                     4  the run changed under the command (another process
    │   │                                    moved it at the same moment); the store is
    │   │                                    consistent: look at `segue status` and retry
    │   ├── IllegalTransitionError        4  a state change the transition table forbids
    │   └── StoreBusyError                4  another process held the store's write lock past
    │                                        the busy timeout; nothing was written: retry
    ├── FencedError                       1  this attempt's epoch was superseded; it must stop
    ├── StoreError                        1  the metadata store is unusable (schema too new, ...)
    ├── CheckpointError                   1
    │   ├── CheckpointCorruptError        1  a checkpoint failed verification
    │   ├── CheckpointFormatError         1  a manifest, tree or tensor file breaks the format
    │   ├── NoValidCheckpointError        1  committed checkpoints exist but none verifies
    │   ├── CheckpointMismatchError       1  a checkpoint's state tree does not match the
    │   │                                    template a restore was given (not retried)
    │   └── StateTypeError                1  state holds a value checkpoints cannot store
    ├── DataError                         1  a data step cannot go on as it is
    │   ├── InputChangedError             1  the input differs from its pinned snapshot
    │   ├── DeadLetterThresholdError      1  too many records failed (count or rate)
    │   ├── PositionError                 1  a saved position does not fit its source
    │   ├── StagedOutputLostError         1  a committed checkpoint names staged output that is gone
    │   ├── IncompleteInputError          1  a data step reached its end short of its input (a bug:
    │   │                                    the run fails instead of succeeding without records)
    │   ├── MissingInputError             1  a file source's path, directory or glob names no file
    │   └── SinkOwnedError                1  a sink's directory or table belongs to another run
    ├── WaitTimeoutError                  1  a wait for a run's state ran past its timeout
    └── InjectedFault                     1  raised by a fault point (tests only)

Exit code 1 also means the run failed or was cancelled; 3 means it ended
paused; 0 that the command did its job. Anything that is not a SegueError is
a bug in segue: the CLI prints a traceback for it (exit 1, Python's default).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # the run failed or was cancelled, or the command hit an operational error
EXIT_USAGE = 2  # bad input or a refused command; nothing written
EXIT_PAUSED = 3  # the run ended PAUSED
EXIT_CONFLICT = 4  # the run changed under the command, or the store stayed busy; retry


class SegueError(Exception):
    """Base class of every error segue raises on purpose."""

    exit_code = EXIT_FAILED


class UsageError(SegueError):
    """Bad input from the user, or a command the run refuses. Nothing was written."""

    exit_code = EXIT_USAGE


class FlowError(UsageError):
    """The flow file is missing, does not parse, or its DAG is invalid."""


class ParamError(UsageError):
    """A parameter is unknown or its value does not have the declared type."""


class UnknownRunError(UsageError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"unknown run {run_id!r}; `segue ls` lists the runs in this home")
        self.run_id = run_id


class NotFoundError(UsageError):
    """The run has no step (or attempt) of that name, or no token has it: a 404 over HTTP."""


class RunExistsError(UsageError):
    def __init__(self, run_id: str) -> None:
        super().__init__(
            f"run {run_id!r} already exists; pick another --run-id or `segue resume {run_id}`"
        )
        self.run_id = run_id


class CodeChangedError(UsageError):
    """Resume refused because the flow's code changed since the run began."""


def _transition_message(what: str, from_state: str, to_state: str, hint: str) -> str:
    msg = f"{what} cannot go from {from_state} to {to_state}"
    return f"{msg}; {hint}" if hint else msg


class RunStateError(UsageError):
    """The command does not apply to the run as it is (checked before writing)."""

    def __init__(self, what: str, from_state: str, to_state: str, hint: str = "") -> None:
        super().__init__(_transition_message(what, from_state, to_state, hint))
        self.from_state = from_state
        self.to_state = to_state

    @classmethod
    def refusing(cls, exc: IllegalTransitionError) -> RunStateError:
        """The user-facing refusal of a transition the table forbids (same message)."""
        err = cls("", exc.from_state, exc.to_state)
        err.args = exc.args
        return err


class ControllerConflictError(UsageError):
    """A second controller tried to drive a run whose controller is alive."""


class PermissionDeniedError(UsageError):
    """`segue server` refused the request's token: missing, unknown, or not allowed (401/403)."""


class ConflictError(SegueError):
    """The run changed under the command: another process won a race."""

    exit_code = EXIT_CONFLICT


class IllegalTransitionError(ConflictError):
    """The transition table forbids the change (raised inside the store's transaction).

    Commands check the state first and raise :class:`RunStateError` for what
    the user asked; this one means the state moved between that check and the
    write, or the engine itself tried something it must not: not bad input.
    """

    def __init__(self, what: str, from_state: str, to_state: str, hint: str = "") -> None:
        super().__init__(_transition_message(what, from_state, to_state, hint))
        self.from_state = from_state
        self.to_state = to_state


class StoreBusyError(ConflictError):
    """Another process held the metadata store's write lock past the busy timeout.

    Exit 4 as its parent: another process was in the way, nothing was written
    and a retry can succeed. The controller waits these out (``run.outage``).
    """


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


class CheckpointFormatError(CheckpointError):
    """A manifest, state tree or tensor file does not follow the checkpoint format."""


class NoValidCheckpointError(CheckpointError):
    """Committed checkpoints exist, but none of them verifies."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint verifies, but its state tree differs from ``restore(like=template)``
    (keys, shapes, dtypes): the code changed since it was saved. A retry reads the same
    checkpoint, so it cannot help. ``mismatches`` lists every difference found."""

    segue_retryable = False
    SHOWN = 3

    def __init__(self, checkpoint: str, mismatches: list[str], fix: str) -> None:
        shown = mismatches[: self.SHOWN]
        more = len(mismatches) - len(shown)
        listed = "; ".join(shown + ([f"+{more} more"] if more else []))
        super().__init__(f"{checkpoint} does not match the template: {listed}; {fix}")
        self.checkpoint = checkpoint
        self.mismatches = list(mismatches)


class StateTypeError(CheckpointError, TypeError):
    """A value in the state tree cannot be stored without pickle."""


class DataError(SegueError):
    """Base class of data-step errors.

    ``segue_retryable = False`` tells the engine a retry cannot help: the step
    fails at once (or the run pauses, with pause_on_failure) for the operator.
    The engine maps DeadLetterThresholdError to pause or fail (pause_on_failure).
    """

    segue_retryable = False


_INPUT_POLICY_DOES = {"include-new": "also read what was added",
                      "pin": "read the input as it was when the run began"}


class InputChangedError(DataError):
    """The input differs from its pinned snapshot and the run's policy cannot go on.

    ``accepts``: the other ``on_input_change`` policies that would go on with
    these changes; only those are offered, in the CLI's spelling. ``note``
    says why include-new is not among them, where it is not.
    """

    def __init__(self, step: str, changes: list[str], *, accepts: tuple[str, ...] = (),
                 note: str = "") -> None:
        shown = "; ".join(changes[:10]) + (
            f"; and {len(changes) - 10} more" if len(changes) > 10 else ""
        )
        offers = " or ".join(f"`--on-input-change {p}` ({_INPUT_POLICY_DOES[p]})" for p in accepts)
        hint = (f"restore it, or resume with {offers}" if offers else
                f"restore it, or start the step over with `--restart-step {step}` (this discards "
                f"what it published)")
        super().__init__(f"input of step {step!r} changed since the run began ({shown}); {hint}"
                         + (f"; {note}" if note else ""))
        self.step = step
        self.changes = changes
        self.accepts = accepts


class DeadLetterThresholdError(DataError):
    def __init__(
        self, step: str, failures: int, records: int, limit: str, dead_letter: str
    ) -> None:
        super().__init__(
            f"step {step!r}: {failures} of {records} records failed ({limit}); they are in "
            f"{dead_letter}; fix the function or raise the limit, then resume"
        )
        self.step = step
        self.failures = failures
        self.records = records


class PositionError(DataError):
    """A position or shard description does not match its source."""


class StagedOutputLostError(DataError):
    """A committed checkpoint names staged output that is neither staged nor published."""


class IncompleteInputError(DataError):
    """A data step reached its end having read less of its input than its shards hold.

    Checked before the step's last checkpoint commits, so a run can never end
    SUCCEEDED with records missing; the output published so far stays, and the
    step's committed position says where it stood.
    """

    def __init__(self, step: str, unit: str, read: float, total: float) -> None:
        super().__init__(
            f"step {step!r} reached its end having read {read:,.0f} of the {total:,.0f} {unit} its "
            f"input holds; this is a bug in segue: the run is failed so no record is silently "
            f"missing; report it with `segue events RUN`"
        )
        self.step, self.unit, self.read, self.total = step, unit, read, total


class MissingInputError(DataError):
    """A file source's exact path does not exist, or its directory or glob holds no file.

    Raised by the listing every snapshot starts with (and by ``segue run``'s
    probe of a declared source), so an empty input never succeeds with 0 records.
    """


class SinkOwnedError(DataError):
    """A sink's output (directory and prefix, or table) belongs to another run; the message names it.

    Refused before anything is written; ``mode="overwrite"`` or ``mode="append"``
    on the sink is the explicit way to replace or add to that output.
    """


class WaitTimeoutError(SegueError):
    """``Client.wait`` (or ``pause(wait=True)``) ran past its timeout; the run is as it was."""

    def __init__(self, run_id: str, state: object, wanted: list[str], timeout: float) -> None:
        shown = getattr(state, "value", state)
        super().__init__(f"run {run_id!r} is still {shown} after {timeout:g}s (waited for "
                         f"{' or '.join(wanted)}); wait longer or see `segue status {run_id}`")
        self.run_id = run_id
        self.state = state


class InjectedFault(SegueError):
    """Raised by a fault point armed through SEGUE_FAULTS (tests only)."""


def exit_code(exc: SegueError) -> int:
    """The CLI exit code of an error (see the table above)."""
    return int(getattr(exc, "exit_code", EXIT_FAILED))
