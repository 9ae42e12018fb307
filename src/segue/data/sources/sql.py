"""A SQL query read with keyset pagination (SQLite, PostgreSQL).

Rows are read ``ORDER BY key`` in pages of ``WHERE key > last``; the position
is the last key read, so resuming costs one indexed seek, never a rescan or an
OFFSET. The key must be unique, non-null and JSON-representable (int or str).
Shards are key ranges ``(lo, hi]`` cut at quantiles taken once at the first
start and kept in the pinned snapshot; rows inserted later below the cursor
are not seen (documented).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .._sql import Db, ident
from ..errors import InputChangedError, PositionError
from .base import Batch, Position, Shard, Source

NEW_ROWS_ONLY = "include-new accepts new rows past the pinned max key only, not removed ones"


@dataclass
class KeyRangeShard(Shard):
    source: SqlSource = field(repr=False, compare=False)
    lo: Any  # exclusive; None = from the start
    hi: Any  # inclusive; None = empty input
    key: str

    def start(self) -> Position:
        return {"after": self.lo, "records": 0}

    def _where(self, after: Any) -> tuple[str, list[Any]]:
        k = self.source.key
        conds, args = [], []
        if after is not None:
            conds.append(f"{k} > ?")
            args.append(after)
        conds.append(f"{k} <= ?")
        args.append(self.hi)
        return " AND ".join(conds), args

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        if self.hi is None:
            return
        after, n = position["after"], int(position["records"])
        src = self.source
        db = Db(src.url)
        try:
            while True:
                where, args = self._where(after)
                cur = db.execute(f"SELECT * FROM ({src.query}) AS q WHERE {where} ORDER BY {src.key} LIMIT ?",
                                 [*args, min(batch, src.page_size)])
                names = [d[0] for d in cur.description]
                rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
                if not rows:
                    return
                after = rows[-1][src.key]
                n += len(rows)
                yield Batch(rows, {"after": after, "records": n}, 0)
        finally:
            db.close()

    def split(self, position: Position) -> tuple[KeyRangeShard, KeyRangeShard] | None:
        if self.hi is None:
            return None
        src = self.source
        db = Db(src.url)
        try:
            where, args = self._where(position["after"])
            (count,) = db.execute(f"SELECT count(*) FROM ({src.query}) AS q WHERE {where}", args).fetchone()
            if count < 2:
                return None
            (mid,) = db.execute(
                f"SELECT {src.key} FROM ({src.query}) AS q WHERE {where} ORDER BY {src.key} LIMIT 1 OFFSET ?",
                [*args, count // 2 - 1]).fetchone()
        finally:
            db.close()
        return (KeyRangeShard(src, position["after"], mid, self.key + "a"),
                KeyRangeShard(src, mid, self.hi, self.key + "b"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "keyrange", "lo": self.lo, "hi": self.hi, "key": self.key}


class SqlSource(Source):
    """Rows of ``query`` (or a table name) from a ``sqlite:///`` or ``postgresql://`` URL."""

    kind = "sql"

    def __init__(self, url: str, query: str, *, key: str = "id", shards: int = 1,
                 page_size: int = 1000) -> None:
        self.url = url
        self.query = f"SELECT * FROM {ident(query)}" if " " not in query.strip() else query
        self.key = ident(key)
        self.n_shards = max(1, int(shards))
        self.page_size = int(page_size)

    def snapshot(self) -> dict[str, Any]:
        db = Db(self.url)
        try:
            rows, max_key = db.execute(f"SELECT count(*), max({self.key}) FROM ({self.query}) AS q").fetchone()
            bounds: list[Any] = []
            for i in range(1, self.n_shards):
                got = db.execute(f"SELECT {self.key} FROM ({self.query}) AS q ORDER BY {self.key} LIMIT 1 OFFSET ?",
                                 [rows * i // self.n_shards - 1]).fetchone() if rows * i // self.n_shards else None
                if got is not None and (not bounds or got[0] != bounds[-1]):
                    bounds.append(got[0])
        finally:
            db.close()
        return {"kind": self.kind, "items": {"query": {"rows": rows, "max_key": max_key}}, "bounds": bounds}

    def shards(self, snapshot: dict[str, Any]) -> list[Shard]:
        hi = snapshot["items"]["query"]["max_key"]
        if hi is None:
            return [KeyRangeShard(self, None, None, "00000")]
        cuts = [None, *snapshot.get("bounds", []), hi]
        return [KeyRangeShard(self, cuts[i], cuts[i + 1], f"{i:05d}") for i in range(len(cuts) - 1)]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        if data.get("kind") != "keyrange":
            raise PositionError(f"shard {data!r} is not a key-range shard")
        return KeyRangeShard(self, data["lo"], data["hi"], data["key"])

    def pinned(self, snapshot: dict[str, Any], now: dict[str, Any], policy: str,
               step: str = "?") -> dict[str, Any]:
        old, new = snapshot["items"]["query"], now["items"]["query"]
        if old == new or policy == "pin":
            return snapshot
        change = f"query rows {old['rows']} -> {new['rows']}, max {self.key} {old['max_key']!r} -> {new['max_key']!r}"
        shrank = old["max_key"] is not None and (new["max_key"] is None or new["max_key"] < old["max_key"])
        if policy == "fail":  # pin reads up to the pinned max key; include-new also past it
            raise InputChangedError(step, [change], accepts=("pin",) if shrank else ("include-new", "pin"),
                                    note=NEW_ROWS_ONLY if shrank else "")
        if shrank:
            raise InputChangedError(step, [change + " (rows were removed)"], accepts=("pin",),
                                    note=NEW_ROWS_ONLY)
        bounds = list(snapshot.get("bounds", []))
        if old["max_key"] is not None:
            bounds.append(old["max_key"])
        return {**snapshot, "items": {"query": new}, "bounds": bounds}
