"""Running flows: the controller, worker processes, step context and lifecycle operations."""

from .context import StepContext
from .controller import Controller, Interrupts
from .options import RunOptions

__all__ = ["Controller", "Interrupts", "RunOptions", "StepContext"]
