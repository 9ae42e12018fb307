"""benchmarks.queues: a Redis stream -> a light transform -> JSONL, through segue's map step.

``trace=PATH`` appends each processed key to PATH (the kill run counts the messages
processed twice from it); ``hold=PATH`` makes the message with key ``hold_k`` wait until PATH
exists, so the kill run cannot end before its kill. Both empty for the timed runs.
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, run_map
from segue.data.sources.redis_stream import RedisStreamSource

flow = Flow("bench_queue", params={"url": "", "stream": "", "out": "", "batch": 500,
                                   "every": "1s", "trace": "", "hold": "", "hold_k": -1})


def transform(r):
    return {"k": r["k"], "v": r["v"].upper()}


@flow.step(retries=100, checkpoint_every="1s")
def consume(ctx):
    p = ctx.params
    src = RedisStreamSource(p["url"], p["stream"], drain_after_empty_reads=1, block_ms=0)
    fn = transform
    if p["trace"]:
        fd = os.open(p["trace"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

        def fn(r):  # noqa: F811 - the traced variant of transform
            if r["k"] == p["hold_k"]:
                while not os.path.exists(p["hold"]):
                    time.sleep(0.01)
            os.write(fd, b"%d\n" % r["k"])
            return transform(r)

    return run_map(ctx, src, fn, JsonlSink(p["out"]), read_batch=int(p["batch"]))
