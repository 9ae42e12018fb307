"""A data step whose sink (JSONL or SQLite) and its ownership mode come from parameters.

Used by the ownership, restart-step, input-policy and dead-letter tests. With
``hold=PATH`` the record with key ``hold_k`` waits until PATH exists (a pause
request lets it through), so a test can park the step with output published
and the rest still to do, whatever the machine's speed. Records whose key is a
multiple of ``bad_every`` raise, so they go to the dead-letter sink.
"""

import os
import sqlite3
import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource, SqlSink, run_map

flow = Flow("owned", params={"input": "", "out": "", "mode": "", "sink": "jsonl", "hold": "",
                             "hold_k": -1, "bad_every": 0})


def make_sink(kind: str, out: str, mode: str):
    if kind == "jsonl":
        return JsonlSink(out, mode=mode or "new")
    os.makedirs(out, exist_ok=True)
    conn = sqlite3.connect(f"{out}/out.db", timeout=30)
    conn.execute("CREATE TABLE IF NOT EXISTS results (k INTEGER, v TEXT)")
    conn.close()
    return SqlSink(f"sqlite:///{out}/out.db", "results", ["k", "v"], mode=mode or "transactional")


@flow.step(retries=0, checkpoint_every="100ms")
def transform(ctx):
    p = ctx.params

    def fn(r):
        if p["hold"] and r["k"] == p["hold_k"]:
            while not os.path.exists(p["hold"]) and not ctx.pause_requested:
                time.sleep(0.01)
        if p["bad_every"] and r["k"] % p["bad_every"] == 0:
            raise ValueError(f"record {r['k']} is bad on purpose")
        return {"k": r["k"], "v": r["v"].upper()}

    src = JsonlSource(p["input"], shard_bytes=50_000)
    return run_map(ctx, src, fn, make_sink(p["sink"], p["out"], p["mode"]),
                   max_failures=None, max_failure_rate=None)
