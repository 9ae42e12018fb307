"""segue: resumable runs for long batch and AI pipelines.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from .errors import (
    CheckpointCorruptError,
    CheckpointError,
    CodeChangedError,
    ControllerConflictError,
    FencedError,
    FlowError,
    IllegalTransitionError,
    NoValidCheckpointError,
    ParamError,
    SegueError,
    StateTypeError,
    UnknownRunError,
    UsageError,
)
from .flow import Flow, Param
from .run.context import StepContext
from .run.options import RunOptions
from .run.outputs import read_output
from .states import RunState, TaskState

__version__ = "0.1.0"

__all__ = [
    "CheckpointCorruptError",
    "CheckpointError",
    "CodeChangedError",
    "ControllerConflictError",
    "FencedError",
    "Flow",
    "FlowError",
    "IllegalTransitionError",
    "NoValidCheckpointError",
    "Param",
    "ParamError",
    "RunOptions",
    "RunState",
    "SegueError",
    "StateTypeError",
    "StepContext",
    "TaskState",
    "UnknownRunError",
    "UsageError",
    "__version__",
    "read_output",
]
