"""The source and shard interfaces: what a data step reads, and where it is.

A :class:`Source` lists its input once as a JSON *snapshot* (pinned in the
step state) and cuts that snapshot into :class:`Shard` objects in a
documented, deterministic order. A shard reads batches from a JSON
*position* that is O(1) in size (an offset, a row index, a last key), never a
set of processed ids. ``shard.split(position)`` cuts what remains of a shard
into two shards whose union is exactly that remainder, for rebalancing.

Sources never write anything and hold no open handles between calls, so a
source can be rebuilt in another process from its constructor arguments.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

Position = dict[str, Any]


@dataclass(frozen=True)
class BadRecord:
    """A record the source could not decode; the driver sends it to the dead-letter sink."""

    raw: str
    error: str


@dataclass(frozen=True)
class Batch:
    """Records read from a shard, and the position right after the last one."""

    records: list[Any]
    position: Position
    nbytes: int  # input bytes consumed by this batch (0 where unknown)
    has_bad: bool = False  # some records are BadRecord (the driver checks only then)
    # The source cannot read on until a commit acknowledges what it read (a queue's
    # prefetch window is full, or a redelivery count must be durable first): the
    # driver checkpoints at once instead of waiting for checkpoint_due.
    flush: bool = False


class Shard(ABC):
    """A contiguous, independently readable part of a source's input."""

    key: str  # stable, filename-safe; used in output part names

    @abstractmethod
    def start(self) -> Position:
        """The position before the shard's first record."""

    @abstractmethod
    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        """Batches from ``position`` to the end of the shard."""

    @abstractmethod
    def split(self, position: Position) -> tuple[Shard, Shard] | None:
        """Two shards that together hold exactly the records after ``position``.

        The first one starts at ``position`` itself (so a reader can keep
        going in it). None when the remainder is too small to split.
        """

    @abstractmethod
    def to_json(self) -> dict[str, Any]:
        """The shard's description; ``Source.shard_from_json`` rebuilds it."""

    def size(self) -> tuple[int | None, str]:
        """(total, unit): the shard's size in "bytes" or "records" where cheap, else (None, unit)."""
        return None, "records"

    def done(self, position: Position) -> int:
        """How much of :meth:`size` lies before ``position`` (same unit)."""
        return int(position.get("records", 0))


class Source(ABC):
    """A description of input data; cheap to construct, deterministic to shard."""

    kind: str = "source"
    # A message queue (segue.data.sources.redis_stream): unbounded, one shard, read by
    # one process (workers=1); it holds a broker connection for the attempt and
    # acknowledges messages in after_commit, never before.
    queue: bool = False

    @abstractmethod
    def snapshot(self) -> dict[str, Any]:
        """What the input is now: ``{"kind": ..., "items": {name: {attrs}}}``, items in shard order."""

    @abstractmethod
    def shards(self, snapshot: dict[str, Any]) -> list[Shard]:
        """The shards of a (pinned) snapshot, in their documented order."""

    @abstractmethod
    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        """Rebuild a shard from :meth:`Shard.to_json`."""

    def pinned(self, snapshot: dict[str, Any], now: dict[str, Any], policy: str,
               step: str = "?") -> dict[str, Any]:
        """The snapshot to read under ``policy`` (see :mod:`segue.data.pinning`)."""
        from ..pinning import reconcile

        return reconcile(snapshot, now, policy, step)

    # -- hooks for sources that hold a connection and acknowledge (message queues) --
    def attach(self, scope: Any) -> None:  # noqa: B027 - optional hook
        """Called once per attempt, before any shard is read, with its ``sinks.base.Scope``."""

    def after_commit(self, position: Position | None) -> None:  # noqa: B027 - optional hook
        """The checkpoint that recorded ``position`` committed and the sinks published what
        it covers: acknowledge what it covers. Also called on restore with the restored
        position, after the sinks rolled it forward (a crash may have come before the ack)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """The attempt is over (done, parked or failed): release connections."""
