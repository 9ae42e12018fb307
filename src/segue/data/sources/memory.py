"""An in-memory sequence as a source: shards are index ranges, the position an index.

The sequence must be the same on every start (built deterministically, for
instance from the step's params); the snapshot holds its length only.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import PositionError
from .base import Batch, Position, Shard, Source


@dataclass
class RangeShard(Shard):
    source: SequenceSource = field(repr=False, compare=False)
    begin: int
    end: int
    key: str

    def start(self) -> Position:
        return {"index": self.begin, "records": 0}

    def size(self) -> tuple[int | None, str]:
        return self.end - self.begin, "records"

    def done(self, position: Position) -> int:
        return int(position["index"]) - self.begin

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        i, n = int(position["index"]), int(position["records"])
        data = self.source.data
        while i < self.end:
            j = min(self.end, i + batch)
            n += j - i
            yield Batch(list(data[i:j]), {"index": j, "records": n}, 0)
            i = j

    def split(self, position: Position) -> tuple[RangeShard, RangeShard] | None:
        i = int(position["index"])
        if self.end - i < 2:
            return None
        mid = (i + self.end) // 2
        return (RangeShard(self.source, i, mid, self.key + "a"),
                RangeShard(self.source, mid, self.end, self.key + "b"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "range", "begin": self.begin, "end": self.end, "key": self.key}


class SequenceSource(Source):
    """Records from a Python sequence, cut into ``shards`` equal index ranges."""

    kind = "sequence"

    def __init__(self, data: Sequence[Any], *, shards: int = 1) -> None:
        self.data = data
        self.n_shards = max(1, int(shards))

    def snapshot(self) -> dict[str, Any]:
        return {"kind": self.kind, "items": {"sequence": {"size": len(self.data)}}}

    def shards(self, snapshot: dict[str, Any]) -> list[Shard]:
        n = int(snapshot["items"]["sequence"]["size"])
        k = self.n_shards
        bounds = [n * i // k for i in range(k + 1)]
        return [RangeShard(self, bounds[i], bounds[i + 1], f"{i:05d}") for i in range(k)]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        if data.get("kind") != "range":
            raise PositionError(f"shard {data!r} is not a range shard")
        return RangeShard(self, data["begin"], data["end"], data["key"])
