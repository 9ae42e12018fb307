"""The main job: a nightly training and scoring pipeline, resumable at every step.

prepare -> train -> score -> publish

* prepare builds a synthetic data set in chunks (checkpointing between chunks);
* train fits a small two-layer NumPy network with minibatch SGD + momentum,
  drawing minibatches from a numpy Generator kept in its state;
* score batch-scores a held-out set, checkpointing the reader position;
* publish writes the predictions and a summary to the output directory.

Everything is deterministic given `seed`, so an interrupted run must end
bit-identical to an uninterrupted one.
"""

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from segue import Flow, Param

flow = Flow(
    "nightly",
    params={
        "seed": Param(7, help="seed for data and training"),
        "rows": Param(24_000, help="training rows"),
        "features": Param(48),
        "hidden": Param(192),
        "train_steps": Param(3_000),
        "batch": Param(256),
        "lr": Param(0.05),
        "score_rows": Param(60_000),
        "out_dir": Param("", help="where publish writes; default HOME/../nightly-out/RUN"),
    },
)

CHUNK = 4_000


def _truth(rng: np.random.Generator, features: int) -> np.ndarray:
    return rng.standard_normal((features,))


@flow.step(retries=2, checkpoint_every_steps=1)
def prepare(ctx):
    p = ctx.params
    state = ctx.restore() or {
        "rng": np.random.default_rng(p["seed"]),
        "truth": None,
        "chunks": [],
    }
    rng = state["rng"]
    if state["truth"] is None:
        state["truth"] = _truth(rng, p["features"])
    n_chunks = -(-p["rows"] // CHUNK)
    while len(state["chunks"]) < n_chunks:
        x = rng.standard_normal((CHUNK, p["features"]))
        logits = x @ state["truth"] + 0.5 * np.sin(3 * x[:, 0])
        y = (logits + 0.3 * rng.standard_normal(CHUNK) > 0).astype(np.float64)
        state["chunks"].append({"x": x, "y": y})
        ctx.progress(len(state["chunks"]), n_chunks)
        if ctx.checkpoint_due(len(state["chunks"])):
            ctx.checkpoint(state, position={"chunk": len(state["chunks"])})
    x = np.concatenate([c["x"] for c in state["chunks"]])[: p["rows"]]
    y = np.concatenate([c["y"] for c in state["chunks"]])[: p["rows"]]
    return {"x": x, "y": y, "truth": state["truth"]}


def _forward(w, x):
    h = np.tanh(x @ w["w1"] + w["b1"])
    z = h @ w["w2"] + w["b2"]
    return h, 1.0 / (1.0 + np.exp(-z))


@flow.step(after=[prepare], retries=3, checkpoint_every="1s")
def train(ctx):
    p = ctx.params
    data = ctx.inputs["prepare"]
    x, y = data["x"], data["y"]
    state = ctx.restore()
    if state is None:
        init = np.random.default_rng(p["seed"] + 1)
        f, h = p["features"], p["hidden"]
        state = {
            "step": 0,
            "weights": {
                "w1": init.standard_normal((f, h)) / np.sqrt(f),
                "b1": np.zeros(h),
                "w2": init.standard_normal((h,)) / np.sqrt(h),
                "b2": np.zeros(()),
            },
            "momentum": {k: np.zeros(s) for k, s in (("w1", (f, h)), ("b1", (h,)), ("w2", (h,)), ("b2", ()))},
            "rng": np.random.default_rng(p["seed"] + 2),
            "losses": [],
        }
    w, m, rng = state["weights"], state["momentum"], state["rng"]
    total = p["train_steps"]
    while state["step"] < total:
        idx = rng.integers(0, len(x), p["batch"])
        xb, yb = x[idx], y[idx]
        hb, pred = _forward(w, xb)
        err = (pred - yb) / len(idx)
        grads = {"w2": hb.T @ err, "b2": err.sum()}
        dh = np.outer(err, w["w2"]) * (1 - hb**2)
        grads["w1"] = xb.T @ dh
        grads["b1"] = dh.sum(axis=0)
        for k in w:
            m[k] = 0.9 * m[k] + grads[k]
            w[k] = w[k] - p["lr"] * m[k]
        state["step"] += 1
        if state["step"] % 100 == 0:
            eps = 1e-12
            state["losses"].append(float(-np.mean(yb * np.log(pred + eps) + (1 - yb) * np.log(1 - pred + eps))))
        ctx.progress(state["step"], total)
        if ctx.checkpoint_due(state["step"]):
            ctx.checkpoint(state, position={"step": state["step"]})
    return {"weights": w, "losses": state["losses"]}


@flow.step(after=[prepare, train], retries=3, checkpoint_every="1s")
def score(ctx):
    p = ctx.params
    model = ctx.inputs["train"]["weights"]
    truth = ctx.inputs["prepare"]["truth"]
    batch = 2_000
    n_batches = -(-p["score_rows"] // batch)
    state = ctx.restore() or {"batch": 0, "scores": np.zeros(p["score_rows"]), "correct": 0}
    while state["batch"] < n_batches:
        b = state["batch"]
        # Each batch is derived from (seed, batch index): a reader with an O(1) position.
        rng = np.random.default_rng([p["seed"], 1_000, b])
        rows = min(batch, p["score_rows"] - b * batch)
        xb = rng.standard_normal((rows, p["features"]))
        yb = (xb @ truth + 0.5 * np.sin(3 * xb[:, 0]) > 0)
        _, s = _forward(model, xb)
        state["scores"][b * batch : b * batch + rows] = s
        state["correct"] += int(np.sum((s > 0.5) == yb))
        state["batch"] += 1
        ctx.progress(state["batch"], n_batches)
        if ctx.checkpoint_due(state["batch"]):
            ctx.checkpoint(state, position={"batch": state["batch"]})
    return {"scores": state["scores"], "accuracy": state["correct"] / p["score_rows"]}


@flow.step(after=[score])
def publish(ctx):
    scores = ctx.inputs["score"]["scores"]
    out = ctx.params["out_dir"] or os.path.join(os.environ.get("SEGUE_HOME", ".segue"), "..", "nightly-out", ctx.run_id)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / "scores.npy.tmp"
    with open(tmp, "wb") as f:
        np.save(f, scores)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, out_dir / "scores.npy")
    summary = {
        "accuracy": ctx.inputs["score"]["accuracy"],
        "scores_sha256": hashlib.sha256(scores.tobytes()).hexdigest(),
        "rows": int(scores.shape[0]),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary
