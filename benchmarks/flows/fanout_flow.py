"""benchmarks.fanout: a parent that returns ``n`` items, a fan-out over them, a join."""

from segue import Flow

flow = Flow("fanout", params={"n": 10_000})


@flow.step
def list_items(ctx):
    return [f"item-{i:06d}" for i in range(ctx.params["n"])]


@flow.foreach(over=list_items)
def handle(ctx):
    return len(ctx.item) + ctx.index


@flow.step(after=[handle])
def join(ctx):
    return sum(ctx.inputs["handle"])
