"""Batch inference with a tiny PyTorch model: texts -> features -> TinyNet -> Parquet."""

from infer_kit import features, gate, sink, source

from segue import Flow
from segue.inference.handlers import PytorchModelHandler

flow = Flow("embed_torch", params={"input": "", "out": "", "shard_bytes": 20_000, "hold": "", "hold_k": -1,
                                   "sleep": 0.0})

tiny = PytorchModelHandler("tinynet:TinyNet", model_params={"width": 64}, name="tinynet", version="1",
                           batch_size=16, device="cpu")


@flow.map(source=source, sink=sink, model=tiny, retries=10_000, checkpoint_every="100ms")
def infer(batch, model, params):
    gate(batch, params)
    if params["sleep"]:
        import time

        time.sleep(params["sleep"])
    ys = model([features(r["text"]) for r in batch])
    return [{"k": r["k"], "y": y} for r, y in zip(batch, ys, strict=True)]
