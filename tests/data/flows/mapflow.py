"""A data step for the kill campaigns: JSONL input -> transform -> the sink named by `sink`.

The transform is deterministic, so a clean run and a run under any number of
SIGKILLs and pauses must publish the same set of records.

``hold=PATH`` with ``hold_k=K``: the record with key K waits until PATH exists
(a pause while held ends at the pause deadline), so a campaign's faults all
land before the run can finish, however fast or slow the machine is.
"""

import json
import os
import sqlite3
import time

from segue import Flow
from segue.data import ExternalCallSink, JsonlSink, JsonlSource, ParquetSink, SqlSink, run_map

flow = Flow("datamap", params={"input": "", "out": "", "sink": "jsonl", "sleep_every": 0,
                               "shard_bytes": 200_000, "hold": "", "hold_k": -1})


class FileReceiver:
    """Stands in for a remote API that dedups on the idempotency key: a SQLite table."""

    def __init__(self, path: str) -> None:
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS got (key TEXT PRIMARY KEY, body TEXT, n INTEGER)")

    def __call__(self, record, key: str) -> None:
        self.conn.execute("INSERT INTO got VALUES (?, ?, 1) ON CONFLICT (key) DO UPDATE SET n = n + 1",
                          (key, json.dumps(record, sort_keys=True)))


def make_sink(kind: str, out: str):
    if kind == "jsonl":
        return JsonlSink(out)
    if kind == "parquet":
        return ParquetSink(out)
    if kind == "sqlite":
        conn = sqlite3.connect(f"{out}/out.db", timeout=30)
        conn.execute("CREATE TABLE IF NOT EXISTS results (k INTEGER, v TEXT)")
        conn.close()
        return SqlSink(f"sqlite:///{out}/out.db", "results", ["k", "v"])
    if kind == "external":
        return ExternalCallSink(FileReceiver(f"{out}/receiver.db"), f"{out}/ledger.db")
    raise ValueError(f"unknown sink {kind!r}")


@flow.step(retries=10_000, checkpoint_every="100ms")
def transform(ctx):
    p = ctx.params
    every = p["sleep_every"]
    seen = [0]

    def fn(r):
        if p["hold"] and r["k"] == p["hold_k"]:
            # Tell the campaign this attempt is held: it cannot checkpoint any more until released.
            open(f"{p['hold']}.held-{ctx.epoch}", "w").close()
            # Not even a pause lets it through (a paused step must not finish): a pause
            # while held ends at the pause deadline, which parks the attempt.
            while not os.path.exists(p["hold"]):
                time.sleep(0.01)
        if every:
            seen[0] += 1
            if seen[0] % every == 0:
                time.sleep(0.001)
        return {"k": r["k"], "v": r["v"].upper()}

    src = JsonlSource(p["input"], shard_bytes=p["shard_bytes"])
    return run_map(ctx, src, fn, make_sink(p["sink"], p["out"]))
