"""The urgent evaluation: does the embedding model tell paraphrases from other sentences?

Each record holds a sentence, a paraphrase of it and an unrelated sentence;
the step embeds all three and records both cosine similarities; ``report``
summarises them. It asks for the same GPU as the nightly job, at urgent
priority, so it preempts the nightly job rather than wait for it.
"""

import numpy as np
import pyarrow.parquet as pq
from minilm import handler

from segue import Flow
from segue.data import JsonlSource, ParquetSink

flow = Flow("embedding_eval", params={"pairs": "", "out": ""})

minilm = handler(gpus=1)  # the same model and engine as embed_nightly.py


@flow.map(source=lambda ctx: JsonlSource(ctx.params["pairs"]), sink=lambda ctx: ParquetSink(ctx.params["out"]),
          model=minilm, checkpoint_every="2s")
def similarities(batch, model, params):
    n = len(batch)
    v = model([r["a"] for r in batch] + [r["b"] for r in batch] + [r["other"] for r in batch])
    a, b, other = np.stack(v[:n]), np.stack(v[n:2 * n]), np.stack(v[2 * n:])
    para, unrelated = (a * b).sum(1), (a * other).sum(1)
    return [{"k": r["k"], "paraphrase": float(p), "unrelated": float(u)}
            for r, p, u in zip(batch, para, unrelated, strict=True)]


@flow.step(after=[similarities])
def report(ctx):
    rows = pq.read_table(ctx.params["out"]).to_pylist()
    para = np.array([r["paraphrase"] for r in rows])
    unrelated = np.array([r["unrelated"] for r in rows])
    return {"pairs": len(rows), "mean_paraphrase_cos": round(float(para.mean()), 4),
            "mean_unrelated_cos": round(float(unrelated.mean()), 4),
            "paraphrase_ranked_first": round(float((para > unrelated).mean()), 4)}
