"""Errors of segue.data, all under :class:`~segue.errors.SegueError`.

    SegueError
    ├── FencedError (segue.errors)   a stale epoch tried to publish; reused as is
    └── DataError                    a data step cannot go on as it is
        ├── InputChangedError        the input differs from its pinned snapshot
        ├── DeadLetterThresholdError too many records failed (count or rate)
        ├── PositionError            a saved position does not fit its source
        └── StagedOutputLostError    a committed checkpoint names staged output that is gone

The engine maps DeadLetterThresholdError to pause or fail (pause_on_failure).
"""

from __future__ import annotations

from ..errors import SegueError


class DataError(SegueError):
    """Base class of data-step errors.

    ``segue_retryable = False`` tells the engine a retry cannot help: the step
    fails at once (or the run pauses, with pause_on_failure) for the operator.
    """

    segue_retryable = False


class InputChangedError(DataError):
    def __init__(self, step: str, changes: list[str]) -> None:
        shown = "; ".join(changes[:10]) + (f"; and {len(changes) - 10} more" if len(changes) > 10 else "")
        super().__init__(
            f"input of step {step!r} changed since the run began ({shown}); restore it, or resume "
            f"with on_input_change='pin' (keep the original files) or 'include-new'"
        )
        self.step = step
        self.changes = changes


class DeadLetterThresholdError(DataError):
    def __init__(self, step: str, failures: int, records: int, limit: str, dead_letter: str) -> None:
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
