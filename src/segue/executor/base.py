"""The executor seam: how a controller starts and stops worker attempts.

The local executor runs each attempt as a child process; the Ray executor
runs it as a Ray actor on any node of a cluster (executor/ray.py). Controllers
only use this interface.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..flow.model import Resources


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt."""

    home: Path
    run_id: str
    step: str
    epoch: int
    log_path: Path
    env: dict[str, str]  # variables of other tools the worker needs (CUDA_VISIBLE_DEVICES); no SEGUE_*
    # For executors that place attempts themselves (Ray): the flow's file (its
    # source travels by content), the step's resources and its gang's size.
    flow_path: str = ""
    resources: Resources = field(default_factory=Resources)
    world_size: int = 1
    # The controller's options record for the worker (segue.run.worker_options, its JSON
    # form): the executor hands it to the worker as one JSON line on its stdin, never
    # through the environment. Opaque here, but for the Ray executor's "ray" entry.
    options: dict[str, Any] = field(default_factory=dict)


def warm_members(spec: Launch) -> int:
    """How many sub-workers to warm with the attempt: all of a data step with a fixed
    number of them. An elastic step grows and shrinks by the pool's grants, and a
    gang's ranks are placed as one group: theirs start when the worker asks."""
    lo, hi = spec.resources.workers
    return hi if spec.world_size == 1 and lo == hi > 1 else 0


class WorkerHandle(ABC):
    """A started attempt."""

    pid: int | None

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code once the attempt ended (negative: killed by that signal)."""

    @abstractmethod
    def signal(self, sig: signal.Signals) -> None:
        """Deliver a signal; a no-op once the attempt ended."""

    def waiting(self) -> bool:
        """True while the executor has not started the attempt yet (a cluster
        queue): its worker cannot renew its lease before it runs."""
        return False

    def request_pause(self) -> None:
        self.signal(signal.SIGUSR1)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)


@dataclass(frozen=True)
class PoolHost:
    """A host of the device pool that an executor places attempts on (Executor.pool_host)."""

    host: str  # its key in the pool
    cpus: float
    memory: int  # bytes
    devices: list[tuple[str, int, bool]]  # (name, memory bytes, virtual) each
    source: str  # how it was found ("ray")


class Executor(ABC):
    @abstractmethod
    def launch(self, spec: Launch) -> WorkerHandle: ...

    def pool_host(self) -> PoolHost | None:
        """The pool host whose devices this executor's attempts use, when they are not
        this machine's (Ray: the cluster's GPUs, one host of the pool). None: this
        machine, whose devices the scheduler detects itself."""
        return None
