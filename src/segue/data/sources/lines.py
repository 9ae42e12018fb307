"""Line-oriented files: JSONL (newline-delimited JSON) and CSV, by byte offset.

A JSONL shard covers the records that *begin* in its byte range
``[start, end)``. A reader whose range starts mid-file seeks to ``start - 1``
and skips through the next newline, so every record belongs to exactly one
shard however the file is cut. The position is ``{"offset": next record's
byte offset, "records": records read in this shard}``.

CSV is parsed with the csv module fed one line at a time, so a quoted field
may span lines and the offset after each row is still exact; a CSV shard
always starts at a known record boundary, and :meth:`CsvShard.split` parses
forward from the position to find one.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .base import BadRecord, Batch, Position, Shard
from .files import DEFAULT_SHARD_BYTES, FileSource, check_kind

MIN_SPLIT_BYTES = 2


def _batch(lines: list[bytes], position: Position, nbytes: int) -> Batch:
    # JSON Lines are UTF-8 (jsonlines.org): decoding first skips json's per-call
    # encoding detection on bytes, a third of the parse time of a short record.
    loads = json.loads
    try:
        return Batch([loads(line.decode()) for line in lines], position, nbytes)
    except ValueError:  # a bad line (or a BOM, or UTF-16): parse each as bytes, as json does
        out = _decode_json(lines)
        return Batch(out, position, nbytes, has_bad=any(isinstance(r, BadRecord) for r in out))


def _decode_json(lines: list[bytes]) -> list[Any]:
    loads = json.loads
    out: list[Any] = []
    for line in lines:
        try:
            out.append(loads(line))
        except ValueError as exc:
            out.append(BadRecord(line.decode("utf-8", "replace").rstrip("\n"), f"invalid json: {exc}"))
    return out


class _ByteRange:
    """Positions of a shard that owns the bytes [begin, end) of one file."""

    begin: int
    end: int

    def start(self) -> Position:
        return {"offset": self.begin, "records": 0}

    def size(self) -> tuple[int | None, str]:
        return self.end - self.begin, "bytes"

    def done(self, position: Position) -> int:
        return min(self.end, position["offset"]) - self.begin


@dataclass
class JsonlShard(_ByteRange, Shard):
    source: FileSource = field(repr=False, compare=False)
    path: str
    begin: int
    end: int
    key: str


    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        off, n, end = int(position["offset"]), int(position["records"]), self.end
        if off >= end:
            return
        with self.source.open(self.path) as f:
            if off == self.begin and off > 0:  # unaligned start: skip the record begun before us
                f.seek(off - 1)
                off += len(f.readline()) - 1
            else:
                f.seek(off)
            lines: list[bytes] = []
            b0 = off
            for line in f:
                if off >= end:
                    break
                off += len(line)
                if line.strip():
                    lines.append(line)
                    if len(lines) >= batch:
                        n += len(lines)
                        yield _batch(lines, {"offset": off, "records": n}, off - b0)
                        lines, b0 = [], off
            if lines or off != b0:
                n += len(lines)
                yield _batch(lines, {"offset": off, "records": n}, off - b0)

    def split(self, position: Position) -> tuple[JsonlShard, JsonlShard] | None:
        off = max(int(position["offset"]), self.begin)
        if self.end - off < MIN_SPLIT_BYTES:
            return None
        mid = (off + self.end) // 2
        # The left half keeps the current alignment state: if nothing was read
        # yet (off == begin) it still skips the partial first record.
        left = JsonlShard(self.source, self.path, self.begin if off == self.begin else off, mid, self.key + "a")
        right = JsonlShard(self.source, self.path, mid, self.end, self.key + "b")
        return left, right

    def to_json(self) -> dict[str, Any]:
        return {"kind": "jsonl", "path": self.path, "begin": self.begin, "end": self.end, "key": self.key}


class JsonlSource(FileSource):
    """JSON Lines files: a path, directory, glob (any fsspec URL) or a list of them."""

    kind = "jsonl"

    def __init__(self, urls: str | list[str], *, shard_bytes: int = DEFAULT_SHARD_BYTES) -> None:
        super().__init__(urls)
        self.shard_bytes = int(shard_bytes)

    def file_shards(self, index: int, path: str, attrs: dict[str, Any]) -> list[Shard]:
        size = int(attrs["size"])
        cuts = list(range(0, size, self.shard_bytes)) or [0]
        return [
            JsonlShard(self, path, b, min(size, b + self.shard_bytes) if b + self.shard_bytes < size else size,
                       f"{index:05d}.{j:04d}")
            for j, b in enumerate(cuts)
        ]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        check_kind(data, "jsonl")
        return JsonlShard(self, data["path"], data["begin"], data["end"], data["key"])


@dataclass
class CsvShard(_ByteRange, Shard):
    source: CsvSource = field(repr=False, compare=False)
    path: str
    begin: int  # always a record boundary (0 = file start, header included)
    end: int
    key: str


    def _rows(self, f: Any, off: int) -> Iterator[tuple[list[str], int, int]]:
        """(row, offset where it starts, offset after it), parsing from ``off``."""
        enc = self.source.encoding
        pos = [off]

        def lines() -> Iterator[str]:
            for raw in f:
                pos[0] += len(raw)
                yield raw.decode(enc)

        reader = csv.reader(lines(), **self.source.fmtparams)
        start = off
        for row in reader:
            yield row, start, pos[0]
            start = pos[0]

    def header(self) -> list[str] | None:
        if not self.source.has_header:
            return None
        with self.source.open(self.path) as f:
            for row, _, _ in self._rows(f, 0):
                return row
        return []

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        off, n = int(position["offset"]), int(position["records"])
        header = self.header()
        if off >= self.end:
            return
        with self.source.open(self.path) as f:
            f.seek(off)
            out: list[Any] = []
            bad = False
            b0 = off
            for row, at, after in self._rows(f, off):
                if at >= self.end:
                    break
                off = after
                if at == 0 and header is not None:
                    continue  # the header row itself
                if header is not None:
                    if len(row) != len(header):
                        out.append(BadRecord(",".join(row), f"expected {len(header)} fields, got {len(row)}"))
                        bad = True
                    else:
                        out.append(dict(zip(header, row, strict=True)))
                else:
                    out.append(row)
                if len(out) >= batch:
                    n += len(out)
                    yield Batch(out, {"offset": off, "records": n}, off - b0, bad)
                    out, b0, bad = [], off, False
            if out or off != b0:
                n += len(out)
                yield Batch(out, {"offset": off, "records": n}, off - b0, bad)

    def split(self, position: Position) -> tuple[CsvShard, CsvShard] | None:
        off = int(position["offset"])
        mid = (off + self.end) // 2
        with self.source.open(self.path) as f:
            f.seek(off)
            for _, at, _ in self._rows(f, off):
                if at >= mid and at > off:
                    if at >= self.end:
                        return None
                    return (CsvShard(self.source, self.path, off, at, self.key + "a"),
                            CsvShard(self.source, self.path, at, self.end, self.key + "b"))
        return None

    def to_json(self) -> dict[str, Any]:
        return {"kind": "csv", "path": self.path, "begin": self.begin, "end": self.end, "key": self.key}


class CsvSource(FileSource):
    """CSV files; rows become dicts keyed by the header (or lists without one)."""

    kind = "csv"

    def __init__(self, urls: str | list[str], *, header: bool = True, encoding: str = "utf-8",
                 **fmtparams: Any) -> None:
        super().__init__(urls)
        self.has_header = header
        self.encoding = encoding
        self.fmtparams = fmtparams
        csv.reader(io.StringIO(""), **fmtparams)  # fail early on bad dialect options

    def file_shards(self, index: int, path: str, attrs: dict[str, Any]) -> list[Shard]:
        return [CsvShard(self, path, 0, int(attrs["size"]), f"{index:05d}.0000")]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        check_kind(data, "csv")
        return CsvShard(self, data["path"], data["begin"], data["end"], data["key"])
