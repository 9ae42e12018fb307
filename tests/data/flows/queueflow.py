"""A data step for the queue kill tests: a Redis stream or a RabbitMQ queue -> transform -> JSONL,
Parquet or a stream.

``url`` picks the broker: ``redis://`` reads the stream ``stream``, ``amqp://``
the queue ``stream`` (with ``prefetch``).

``hold=PATH`` with ``hold_k=K``: the message with key K waits until PATH exists,
saying so with ``PATH.held-EPOCH``, so every planned fault lands before the run
can finish (tests/campaign_kit.py). ``sleep_ms`` slows each record a little so
a pause lands before the hold; ``sleep_us`` does it in microseconds (a long campaign
spreads its messages over its kills).
"""

import os
import time

from segue import Flow
from segue.data import JsonlSink, ParquetSink, run_map
from segue.data.sinks.redis_stream import RedisStreamSink
from segue.data.sources.rabbitmq import RabbitMQSource
from segue.data.sources.redis_stream import RedisStreamSource

flow = Flow(
    "queuemap",
    params={
        "url": "",
        "stream": "",
        "out": "",
        "sink": "jsonl",
        "sleep_ms": 0,
        "sleep_us": 0,
        "hold": "",
        "hold_k": -1,
        "prefetch": 200,
    },
)


@flow.step(retries=10_000, checkpoint_every="100ms")
def consume(ctx):
    p = ctx.params

    def fn(r):
        if p["hold"] and r["k"] == p["hold_k"]:
            open(f"{p['hold']}.held-{ctx.epoch}", "w").close()
            while not os.path.exists(p["hold"]):
                time.sleep(0.01)
        if p["sleep_ms"]:
            time.sleep(p["sleep_ms"] / 1000)
        if p["sleep_us"]:
            time.sleep(p["sleep_us"] / 1e6)
        return {"k": r["k"], "v": r["v"].upper()}

    # Every message is in the stream before the run starts: one empty read means drained.
    if p["url"].startswith("amqp"):
        # A kill campaign delivers a held message again at every kill: not poison.
        src = RabbitMQSource(
            p["url"], p["stream"], drain_after_empty_reads=1, block_ms=50,
            prefetch=p["prefetch"], max_deliveries=1000,
        )
    else:
        src = RedisStreamSource(p["url"], p["stream"], drain_after_empty_reads=1, block_ms=0)
    if p["sink"] == "redis":  # the stream "out" on the same server
        sink = RedisStreamSink(p["url"], "out")
    else:
        sink = ParquetSink(p["out"]) if p["sink"] == "parquet" else JsonlSink(p["out"])
    return run_map(ctx, src, fn, sink, read_batch=50)
