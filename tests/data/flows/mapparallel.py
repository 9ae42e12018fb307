"""A data step over two sub-worker processes: JSONL in, uppercase, JSONL out."""

import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("mapparallel", params={"input": "", "out": "out", "shard_bytes": 60_000})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=ctx.params["shard_bytes"]),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    workers=2,
    retries=200,
    checkpoint_every="200ms",
)
def upper(record):
    if record["k"] % 4 == 0:
        time.sleep(0.001)  # stands for real work
    return {"k": record["k"], "v": record["v"].upper()}
