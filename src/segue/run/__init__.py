"""Running flows: the controller, worker processes, step context and lifecycle operations.

The names below load on first use: a worker process imports ``segue.run.worker``
and must not pay for the controller, the scheduler and the host pool at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .context import StepContext
    from .controller import Controller, Interrupts
    from .options import RunOptions

__all__ = ["Controller", "Interrupts", "RunOptions", "StepContext"]

_HOME = {"StepContext": "context", "Controller": "controller", "Interrupts": "controller",
         "RunOptions": "options"}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
