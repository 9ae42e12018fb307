"""A declared data step into a SQL table that may not exist yet (``SqlSink`` creates it).

Each record becomes a row of every kind of value: int, str, float, bytes,
bool and a dict (stored as JSON text). ``columns`` is comma-separated (empty:
the table's own). A record may carry "sleep" (seconds of work), "hold" (a
path: the record waits until it exists, so a test can park the step after
its first checkpoint) and "null" (its ``v`` is None, for a NOT NULL column).
"""

import os
import time

from segue import Flow
from segue.data import JsonlSource, SqlSink

flow = Flow("sqlevents", params={"input": "", "db": "", "table": "events", "columns": "k,v,score,blob,ok,meta"})


def sink(ctx):
    p = ctx.params
    return SqlSink(f"sqlite:///{p['db']}", p["table"], [c for c in p["columns"].split(",") if c])


@flow.map(source=lambda ctx: JsonlSource(ctx.params["input"]), sink=sink, retries=5,
          checkpoint_every="100ms")
def enrich(record):
    k = record["k"]
    if record.get("sleep"):
        time.sleep(record["sleep"])
    while record.get("hold") and not os.path.exists(record["hold"]):
        time.sleep(0.01)
    return {"k": k, "v": None if record.get("null") else f"v{k}", "score": k / 2,
            "blob": str(k).encode(), "ok": k % 2 == 0, "meta": {"k": k, "tags": ["a", "b"]}}
