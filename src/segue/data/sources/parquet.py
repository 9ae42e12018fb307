"""Parquet files through pyarrow: shards of whole row groups, position (row group, row).

Each file is cut into shards of consecutive row groups holding about
``shard_rows`` rows. Internally a shard is the global row range
``[begin, end)`` of its file, so a split may cut inside a row group; the
saved position is ``{"rg": row group, "row": row within it, "records": n}``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .base import Batch, Position, Shard
from .files import FileSource, check_kind


def _pq() -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("the parquet source needs pyarrow; pip install 'segue[data]'") from exc
    return pq


@dataclass
class ParquetShard(Shard):
    source: ParquetSource = field(repr=False, compare=False)
    path: str
    begin: int
    end: int
    key: str
    rg_starts: tuple[int, ...]  # first global row of each row group (+ total at the end)

    def _to_rg(self, row: int) -> tuple[int, int]:
        rg = bisect.bisect_right(self.rg_starts, row) - 1
        return rg, row - self.rg_starts[rg]

    def _global(self, position: Position) -> int:
        return self.rg_starts[int(position["rg"])] + int(position["row"])

    def start(self) -> Position:
        rg, row = self._to_rg(self.begin)
        return {"rg": rg, "row": row, "records": 0}

    def size(self) -> tuple[int | None, str]:
        return self.end - self.begin, "records"

    def done(self, position: Position) -> int:
        return self._global(position) - self.begin

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        at, n = self._global(position), int(position["records"])
        if at >= self.end:
            return
        with self.source.open(self.path) as f:
            pf = _pq().ParquetFile(f)
            while at < self.end:
                rg, row = self._to_rg(at)
                stop = min(self.end, self.rg_starts[rg + 1]) - self.rg_starts[rg]
                rows = pf.read_row_group(rg, columns=self.source.columns).slice(row, stop - row).to_pylist()
                for i in range(0, len(rows), batch):
                    chunk = rows[i:i + batch]
                    at += len(chunk)
                    n += len(chunk)
                    g_rg, g_row = self._to_rg(at) if at < self.rg_starts[-1] else (len(self.rg_starts) - 1, 0)
                    yield Batch(chunk, {"rg": g_rg, "row": g_row, "records": n}, 0)

    def split(self, position: Position) -> tuple[ParquetShard, ParquetShard] | None:
        at = self._global(position)
        if self.end - at < 2:
            return None
        mid = (at + self.end) // 2
        return (ParquetShard(self.source, self.path, at, mid, self.key + "a", self.rg_starts),
                ParquetShard(self.source, self.path, mid, self.end, self.key + "b", self.rg_starts))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "parquet", "path": self.path, "begin": self.begin, "end": self.end,
                "key": self.key, "rg_starts": list(self.rg_starts)}


class ParquetSource(FileSource):
    """Parquet files; rows become dicts (``columns`` selects some)."""

    kind = "parquet"

    def __init__(self, urls: str | list[str], *, columns: list[str] | None = None,
                 shard_rows: int = 1_000_000) -> None:
        super().__init__(urls)
        self.columns = columns
        self.shard_rows = int(shard_rows)

    def item_attrs(self, path: str) -> dict[str, Any]:
        attrs = super().item_attrs(path)
        with self.open(path) as f:
            md = _pq().ParquetFile(f).metadata
            attrs["rows"] = md.num_rows
            attrs["row_groups"] = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
        return attrs

    def file_shards(self, index: int, path: str, attrs: dict[str, Any]) -> list[Shard]:
        starts = [0]
        for n in attrs["row_groups"]:
            starts.append(starts[-1] + n)
        rg_starts = tuple(starts)
        shards: list[Shard] = []
        begin = 0
        for i in range(1, len(starts)):
            if starts[i] - begin >= self.shard_rows or i == len(starts) - 1:
                shards.append(ParquetShard(self, path, begin, starts[i], f"{index:05d}.{len(shards):04d}", rg_starts))
                begin = starts[i]
        return shards or [ParquetShard(self, path, 0, 0, f"{index:05d}.0000", rg_starts)]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        check_kind(data, "parquet")
        return ParquetShard(self, data["path"], data["begin"], data["end"], data["key"],
                            tuple(data["rg_starts"]))
