"""A data step declared with @flow.map over a Pub/Sub subscription: probed at `segue run` (exit 2)."""

from segue import Flow
from segue.data import JsonlSink
from segue.data.sources.pubsub import PubSubSource

flow = Flow("pubsubdecor", params={"emulator": "", "subscription": "", "out": "out/pubsub"})


def source(ctx):
    return PubSubSource(
        ctx.params["subscription"], emulator_host=ctx.params["emulator"], drain_after_empty_reads=1
    )


def sink(ctx):
    return JsonlSink(ctx.params["out"])


@flow.map(source=source, sink=sink, retries=3, checkpoint_every="100ms")
def upper(record):
    return {"k": record["k"], "v": record["v"].upper()}
