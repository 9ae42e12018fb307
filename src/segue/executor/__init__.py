"""Executors start and stop worker attempts: local processes, or Ray actors.

The names below load on first use: a worker process imports
``segue.executor.local_warm`` before anything else (its warmed sub-workers start
from there), and must not pay for the executors' imports to do so.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import Executor, Launch, WorkerHandle
    from .local import LocalProcessExecutor

EXECUTORS = ("local", "ray")

_HOME = {"Executor": "base", "Launch": "base", "WorkerHandle": "base", "LocalProcessExecutor": "local"}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    raise AttributeError(f"module 'segue.executor' has no attribute {name!r}")


def executor_for(name: str, ray_address: str = "") -> Executor:
    """The executor a run's options name (``executor``, ``ray_address``)."""
    if name == "ray":
        from .ray import RayExecutor  # Ray is an extra: imported only when asked for

        return RayExecutor(ray_address)
    from .local import LocalProcessExecutor

    return LocalProcessExecutor()


__all__ = ["EXECUTORS", "Executor", "Launch", "LocalProcessExecutor", "WorkerHandle", "executor_for"]
