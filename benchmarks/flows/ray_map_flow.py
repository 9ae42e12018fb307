"""The map step benchmarks.scale runs on local processes and on Ray: JSONL -> transform -> JSONL.

The same step as benchmarks/flows/pipeline_flow.py (the same ``transform``, the
exactly-once JsonlSink, a durable checkpoint every second), without its probes:
this file has no helper module beside it, because on Ray only the flow file's
own source travels to the node (a sibling import such as ``pause_gate`` fails
there).

The sub-worker count is a decorator argument, fixed when the file is loaded, so
the benchmark picks it with $BENCH_WORKERS. The controller loads this file with
the benchmark's environment; a worker on a Ray node gets the variable because
the benchmark names it in $SEGUE_RAY_ENV.
"""

import os
from typing import Any

from segue import Flow
from segue.data import JsonlSink, JsonlSource

WORKERS = int(os.environ.get("BENCH_WORKERS", "2"))

flow = Flow("bench_ray_map", params={"input": "", "out": ""})


def transform(r: dict[str, Any]) -> dict[str, Any]:
    t = r["text"]
    return {"id": r["id"], "text": t.upper(), "len": len(t), "score": r["x"] * 2.0 + 1.0,
            "tag": r["tag"]}


@flow.map(source=lambda ctx: JsonlSource(ctx.params["input"]),
          sink=lambda ctx: JsonlSink(ctx.params["out"]),
          workers=WORKERS, retries=3, checkpoint_every="1s")
def records(r: dict[str, Any]) -> dict[str, Any]:
    return transform(r)
