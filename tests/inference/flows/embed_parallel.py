"""embed_torch over two sub-workers: each loads the model once for the attempt."""

from infer_kit import features, sink, source

from segue import Flow
from segue.inference.handlers import PytorchModelHandler

flow = Flow("embed_parallel", params={"input": "", "out": "", "shard_bytes": 20_000})

tiny = PytorchModelHandler("tinynet:TinyNet", model_params={"width": 64}, name="tinynet", version="1",
                           batch_size=16, device="cpu")


@flow.map(source=source, sink=sink, model=tiny, workers=2, checkpoint_every="200ms")
def infer(batch, model, params):
    ys = model([features(r["text"]) for r in batch])
    return [{"k": r["k"], "y": y} for r, y in zip(batch, ys, strict=True)]
