"""A data step declared with @flow.map over a RabbitMQ queue: probed at `segue run` (exit 2)."""

from segue import Flow
from segue.data import JsonlSink
from segue.data.sources.rabbitmq import RabbitMQSource

flow = Flow("amqpdecor", params={"url": "", "queue": "", "out": "out/amqp"})


def source(ctx):
    return RabbitMQSource(ctx.params["url"], ctx.params["queue"], drain_after_empty_reads=1)


def sink(ctx):
    return JsonlSink(ctx.params["out"])


@flow.map(source=source, sink=sink, retries=3, checkpoint_every="100ms")
def upper(record):
    return {"k": record["k"], "v": record["v"].upper()}
