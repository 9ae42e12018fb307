"""The two-phase-commit sink interface.

Life of a sink inside :func:`segue.data.run_map`::

    open(scope, committed_state)   recovery: publish what the committed checkpoint
                                   staged (roll forward), delete every other staged
                                   leftover of this run and step (roll back), and
                                   advance the sink's fence to this epoch
    write(records, shard, keys)    buffer / append to a staged part
    stage()                        make the staged parts durable
    state()                        JSON to put into the step checkpoint
    -- ctx.checkpoint(state) --    the commit point
    publish()                      make what the last stage() staged visible; fenced:
                                   refused once a newer epoch opened the sink
    finish()                       the step is done: drop the staging area

Staged names carry (run, step, epoch, part); published names are
deterministic (``part-TAG-SHARD-PART``), so a publish repeated after a crash is a
no-op. A sink never publishes anything the step has not committed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Scope:
    """Who is writing: the attempt's identity, used in staged names and fences."""

    run_id: str
    step: str
    epoch: int
    # The sub-worker of a parallel map step (None: the single-worker path).
    # Sinks that support workers keep each sub-worker's staged and published
    # names apart, so sub-workers never touch one another's parts.
    worker: int | None = None

    @property
    def prefix(self) -> str:
        return f"{self.run_id}/{self.step}/"


class Sink(ABC):
    """A destination with exactly-once semantics through two-phase commit."""

    needs_keys = False  # True: write() receives one stable key per record
    # True: instances opened with distinct ``Scope.worker`` values may run side
    # by side in several processes (``run_map(workers=N)``).
    supports_workers = False

    @abstractmethod
    def open(self, scope: Scope, state: dict[str, Any] | None) -> None:
        """Recover from ``state`` (the committed sink state, None on a first start)."""

    @abstractmethod
    def write(self, records: Sequence[Any], shard: str, keys: Sequence[str] | None = None) -> None:
        """Stage records produced from ``shard`` (buffered; durable after stage())."""

    @abstractmethod
    def stage(self) -> None:
        """Make everything written so far durable under staged names."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """What the next checkpoint must record: the pending staged parts and counters."""

    @abstractmethod
    def publish(self) -> None:
        """Publish what the last ``stage()`` staged; call only after the checkpoint that
        recorded its ``state()`` committed. A sink with ``supports_workers`` may have been
        written to since (a parallel step's sub-worker goes on while the coordinator
        commits): that later output stays unpublished, for the next checkpoint."""

    def preflight(self, run_id: str, step: str) -> None:  # noqa: B027 - optional hook
        """Raise SinkOwnedError if ``open`` would refuse this run's step; writes nothing.

        Lets ``segue run`` refuse a run at submit (exit 2) when its sinks are
        known then (``@flow.map`` declarations)."""

    def finish(self) -> None:  # noqa: B027 - optional hook, most sinks need nothing
        """The step completed: remove the (now empty) staging area."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release handles without publishing (an aborted attempt)."""

    def describe(self) -> str:
        return type(self).__name__
