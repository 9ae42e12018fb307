"""The executor seam: how a controller starts and stops worker attempts.

The local executor runs each attempt as a child process; a Ray executor will
run it as a Ray task. Controllers only use this interface.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one attempt."""

    home: Path
    run_id: str
    step: str
    epoch: int
    log_path: Path
    env: dict[str, str]


class WorkerHandle(ABC):
    """A started attempt."""

    pid: int | None

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code once the attempt ended (negative: killed by that signal)."""

    @abstractmethod
    def signal(self, sig: signal.Signals) -> None:
        """Deliver a signal; a no-op once the attempt ended."""

    def request_pause(self) -> None:
        self.signal(signal.SIGUSR1)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)


class Executor(ABC):
    @abstractmethod
    def launch(self, spec: Launch) -> WorkerHandle: ...
