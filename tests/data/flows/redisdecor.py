"""A data step declared with @flow.map over a Redis stream: probed at `segue run` (exit 2)."""

from segue import Flow
from segue.data import JsonlSink
from segue.data.sources.redis_stream import RedisStreamSource

flow = Flow("redisdecor", params={"url": "", "stream": "", "out": "out/redis"})


def source(ctx):
    return RedisStreamSource(ctx.params["url"], ctx.params["stream"], drain_after_empty_reads=1,
                             block_ms=0)


def sink(ctx):
    return JsonlSink(ctx.params["out"])


@flow.map(source=source, sink=sink, retries=3, checkpoint_every="100ms")
def upper(record):
    return {"k": record["k"], "v": record["v"].upper()}
