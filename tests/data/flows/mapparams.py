"""Map steps that read the run's params, with and without a model, in one and two processes.

Each step tags every record with the ``tag`` param (and the model's own
marker, where there is one), so the output shows the params reached the
function in the step's process and in every sub-worker of ``workers=2``.
"""

from segue import Flow
from segue.data import JsonlSink, JsonlSource
from segue.inference import ModelHandler

flow = Flow("mapparams", params={"input": "", "out": "", "tag": "t", "shard_bytes": 2_000})


def src(ctx):
    return JsonlSource(ctx.params["input"], shard_bytes=ctx.params["shard_bytes"])


def out(name):
    return lambda ctx: JsonlSink(f"{ctx.params['out']}/{name}")


class Marker(ModelHandler):
    """The cheapest model there is: a string it appends."""

    def load_model(self):
        return "+m"

    def run_inference(self, batch, model):
        return [model for _ in batch]


MARKER = Marker(name="marker", batch_size=8, device="cpu")


@flow.map(source=src, sink=out("one"), retries=0)
def one(record, *, params):
    return {"k": record["k"], "tag": params["tag"]}


@flow.map(source=src, sink=out("two"), workers=2, retries=0)
def two(record, params):
    return {"k": record["k"], "tag": params["tag"]}


@flow.map(source=src, sink=out("infer_one"), model=MARKER, retries=0)
def infer_one(batch, model, *, params):
    return [{"k": r["k"], "tag": params["tag"] + m} for r, m in zip(batch, model(batch), strict=True)]


@flow.map(source=src, sink=out("infer_two"), model=MARKER, workers=2, retries=0)
def infer_two(batch, model, params):
    return [{"k": r["k"], "tag": params["tag"] + m} for r, m in zip(batch, model(batch), strict=True)]
