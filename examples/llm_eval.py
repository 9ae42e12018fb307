"""The urgent evaluation: the language model's perplexity on held-out sentences.

A map step scores each sentence with the model (its mean negative
log-likelihood per token, from one forward pass: ``model.raw`` is the
tokenizer and the transformers model the handler loaded); ``report``
summarises them. It asks for the same GPU as the nightly generation job, at
urgent priority, so it preempts the nightly job rather than wait for it.
"""

import math

import pyarrow.parquet as pq
from llm import handler

from segue import Flow
from segue.data import JsonlSource, ParquetSink

flow = Flow("llm_eval", params={"texts": "", "out": ""})
llm = handler(gpus=1)  # the same model and engine as llm_nightly.py


@flow.map(source=lambda ctx: JsonlSource(ctx.params["texts"]), sink=lambda ctx: ParquetSink(ctx.params["out"]),
          model=llm, checkpoint_every="2s")
def score(batch, model, params):
    import torch

    tok, net = model.raw
    out = []
    with torch.inference_mode():
        for r in batch:  # one text at a time: no padding in the loss
            ids = torch.tensor([tok(r["text"])["input_ids"]], device=net.device)
            loss = net(input_ids=ids, labels=ids).loss
            out.append({"k": r["k"], "nll": float(loss), "tokens": int(ids.shape[1]) - 1})
    return out


@flow.step(after=[score])
def report(ctx):
    rows = pq.read_table(ctx.params["out"]).to_pylist()
    tokens = sum(r["tokens"] for r in rows)
    nll = sum(r["nll"] * r["tokens"] for r in rows) / max(tokens, 1)
    return {"texts": len(rows), "tokens": tokens, "mean_nll": round(nll, 4), "perplexity": round(math.exp(nll), 2)}
