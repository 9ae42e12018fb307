"""The tiny PyTorch model with batch_size="auto": the batch comes from `segue bench-model`'s profile.

Each output row records the size of the batch the function saw (``bs``), so a
test can check that the run used the profile's recommended batch.
"""

from infer_kit import features, sink, source

from segue import Flow
from segue.inference.handlers import PytorchModelHandler

flow = Flow("embed_auto", params={"input": "", "out": "", "shard_bytes": 1_000_000})

# Named as embed_torch's handler: one profile (tinynet@1 on cpu) serves both.
tiny = PytorchModelHandler("tinynet:TinyNet", model_params={"width": 64}, name="tinynet", version="1",
                           batch_size="auto", device="cpu")


@flow.map(source=source, sink=sink, model=tiny)
def infer(batch, model, params):
    ys = model([features(r["text"]) for r in batch])
    return [{"k": r["k"], "y": y, "bs": len(batch)} for r, y in zip(batch, ys, strict=True)]
