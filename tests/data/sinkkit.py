"""Sink factories and output readers shared by the sink and driver tests (one contract, every sink)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from segue.data import ExternalCallSink, JsonlSink, ParquetSink, Sink, SqlSink

SINK_KINDS = ["jsonl", "parquet", "sqlite", "sqlite-upsert", "external"]


class Receiver:
    """A remote API that deduplicates on the idempotency key, and counts deliveries."""

    def __init__(self) -> None:
        self.by_key: dict[str, Any] = {}
        self.deliveries = 0

    def __call__(self, record: Any, key: str) -> None:
        self.deliveries += 1
        if key in self.by_key and self.by_key[key] != record:
            raise AssertionError(f"key {key} re-sent with different content")
        self.by_key[key] = record


class SinkKit:
    """Builds a fresh sink per attempt (as a new process would) and reads what was published."""

    def __init__(self, kind: str, root: Path, pg_url: str | None = None) -> None:
        self.kind, self.root = kind, root
        self.receiver = Receiver()
        self.url = pg_url or f"sqlite:///{root / 'out.db'}"
        if kind in ("sqlite", "sqlite-upsert", "postgres", "postgres-upsert"):
            self._exec("DROP TABLE IF EXISTS results")
            self._exec("DROP TABLE IF EXISTS segue_staged_results")
            self._exec("DROP TABLE IF EXISTS segue_sink_ledger")
            self._exec("DROP TABLE IF EXISTS segue_sink_owner")
            self._exec("CREATE TABLE results (k BIGINT PRIMARY KEY, v TEXT)" if "upsert" in kind
                       else "CREATE TABLE results (k BIGINT, v TEXT)")

    def _exec(self, sql: str) -> list[Any]:
        if self.url.startswith("sqlite"):
            with sqlite3.connect(self.url[len("sqlite:///"):]) as c:
                return c.execute(sql).fetchall()
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as c:
            cur = c.execute(sql)
            return cur.fetchall() if cur.description else []

    def make(self) -> Sink:
        k = self.kind
        if k == "jsonl":
            return JsonlSink(self.root / "out")
        if k == "parquet":
            return ParquetSink(self.root / "out", row_group_rows=100)
        if k in ("sqlite", "postgres"):
            return SqlSink(self.url, "results", ["k", "v"])
        if k in ("sqlite-upsert", "postgres-upsert"):
            return SqlSink(self.url, "results", ["k", "v"], mode="upsert", key=["k"])
        if k == "external":
            return ExternalCallSink(self.receiver, str(self.root / "ledger.db"))
        raise ValueError(k)

    def read(self) -> list[dict[str, Any]]:
        """Published records as {"k", "v"} dicts, in no particular order."""
        k = self.kind
        if k == "jsonl":
            out = []
            for p in sorted((self.root / "out").glob("part-*.jsonl")):
                out.extend(json.loads(x) for x in p.read_text().splitlines() if x)
            return out
        if k == "parquet":
            import pyarrow.parquet as pq

            out = []
            for p in sorted((self.root / "out").glob("part-*.parquet")):
                out.extend(pq.read_table(p).to_pylist())
            return out
        if k == "external":
            return list(self.receiver.by_key.values())
        return [{"k": a, "v": b} for a, b in self._exec("SELECT k, v FROM results")]


def records(n: int) -> list[dict[str, Any]]:
    return [{"k": i, "v": f"value-{i}"} for i in range(n)]


def transform(r: dict[str, Any]) -> dict[str, Any]:
    return {"k": r["k"], "v": r["v"].upper()}


Factory = Callable[[], Sink]
