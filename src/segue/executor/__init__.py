"""Executors start and stop worker attempts: local processes, or Ray actors."""

from __future__ import annotations

from .base import Executor, Launch, WorkerHandle
from .local import LocalProcessExecutor

EXECUTORS = ("local", "ray")


def executor_for(name: str, ray_address: str = "") -> Executor:
    """The executor a run's options name (``executor``, ``ray_address``)."""
    if name == "ray":
        from .ray import RayExecutor  # Ray is an extra: imported only when asked for

        return RayExecutor(ray_address)
    return LocalProcessExecutor()


__all__ = ["EXECUTORS", "Executor", "Launch", "LocalProcessExecutor", "WorkerHandle", "executor_for"]
