"""Executors start and stop worker attempts (local processes now; Ray later)."""

from .base import Executor, Launch, WorkerHandle
from .local import LocalProcessExecutor

__all__ = ["Executor", "Launch", "LocalProcessExecutor", "WorkerHandle"]
