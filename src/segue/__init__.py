"""segue: resumable runs for long batch and AI pipelines.

The public surface is what ``__all__`` lists; everything else is internal.
"""

from typing import TYPE_CHECKING as _TYPE_CHECKING

from ._version import __version__
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
    PermissionDeniedError,
    SegueError,
    StateTypeError,
    UnknownRunError,
    UsageError,
    WaitTimeoutError,
)
from .states import RunState, TaskState

if _TYPE_CHECKING:
    from .client import BaseClient, Client, RunStatus, RunSummary
    from .flow import Flow, Param
    from .run.context import StepContext
    from .run.options import RunOptions
    from .run.outputs import read_output

# The rest is imported when first used: `python -m segue` must not pay for
# NumPy and the checkpoint engine before a command needs them.
_LAZY = {
    "BaseClient": "client", "Client": "client", "RunStatus": "client", "RunSummary": "client",
    "Flow": "flow", "Param": "flow", "StepContext": "run.context", "RunOptions": "run.options",
    "read_output": "run.outputs",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'segue' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))



__all__ = [
    "BaseClient",
    "CheckpointCorruptError",
    "CheckpointError",
    "Client",
    "CodeChangedError",
    "ControllerConflictError",
    "FencedError",
    "Flow",
    "FlowError",
    "IllegalTransitionError",
    "NoValidCheckpointError",
    "Param",
    "ParamError",
    "PermissionDeniedError",
    "RunOptions",
    "RunState",
    "RunStatus",
    "RunSummary",
    "SegueError",
    "StateTypeError",
    "StepContext",
    "TaskState",
    "UnknownRunError",
    "UsageError",
    "WaitTimeoutError",
    "__version__",
    "read_output",
]
