"""Like mapdecor, with checkpoints only every 2 s, so an attempt gets well past its last one."""

import time

from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("mapslow", params={"input": "", "out": "out/upper"})


@flow.map(
    source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=40_000),
    sink=lambda ctx: JsonlSink(ctx.params["out"]),
    retries=200,
    checkpoint_every="2s",
    max_failures=5,
)
def upper(record):
    if record.get("sleep"):
        time.sleep(record["sleep"])  # stands for real work per record
    if record.get("bad"):
        raise ValueError(f"record {record['k']} is bad")
    return {"k": record["k"], "v": record["v"].upper()}
