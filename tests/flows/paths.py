"""A flow whose path is chosen at run time: a fan-out, a branch, a bounded loop, a join.

``prefer`` forces the branch ("fast" / "slow"; "auto": by the items' mean score);
``confident_at`` is the iteration at which the loop's ``until`` holds.
``hold``: a directory; each item waits there for ``go-INDEX`` once it wrote
``started-INDEX`` (a test kills while items are in flight, on observed progress).
"""

import os
import time

from segue import Flow

flow = Flow("paths", params={"n": 6, "prefer": "auto", "confident_at": 2, "hold": ""})


@flow.step
def list_shards(ctx):
    return {"shards": [f"shard-{i:03d}" for i in range(ctx.params["n"])]}


@flow.foreach(over=list_shards, key="shards", retries=2)
def score(ctx):
    hold = ctx.params["hold"]
    if hold:
        open(os.path.join(hold, f"started-{ctx.index}"), "w").close()
        while not os.path.exists(os.path.join(hold, f"go-{ctx.index}")):
            time.sleep(0.02)
    return {"shard": ctx.item, "index": ctx.index, "score": (ctx.index * 37 % 10) / 10}


@flow.step(after=[score], choices=["fast_path", "slow_path"])
def route(ctx):
    scores = ctx.inputs["score"]
    mean = sum(s["score"] for s in scores) / max(1, len(scores))
    prefer = ctx.params["prefer"]
    ctx.choose("fast_path" if prefer == "fast" or (prefer == "auto" and mean >= 0.5) else "slow_path")
    return {"mean": mean, "n": len(scores)}


@flow.step(after=[route])
def fast_path(ctx):
    return {"path": "fast", "mean": ctx.inputs["route"]["mean"]}


@flow.step(after=[route])
def slow_path(ctx):
    return {"path": "slow", "mean": ctx.inputs["route"]["mean"]}


@flow.loop(after=[slow_path], until=lambda out: out["confidence"] >= 0.8, max_iterations=4)
def rescore(ctx):
    before = ctx.previous["confidence"] if ctx.previous else 0.2
    done = ctx.iteration >= ctx.params["confident_at"]
    return {"iteration": ctx.iteration, "confidence": 0.9 if done else before + 0.1}


@flow.step(after=[fast_path, rescore])
def join(ctx):
    return {"fast": ctx.inputs["fast_path"], "rescore": ctx.inputs["rescore"]}


def expected(n: int, prefer: str = "auto", confident_at: int = 2) -> dict:
    """The join's output of an uninterrupted run."""
    mean = sum((i * 37 % 10) / 10 for i in range(n)) / max(1, n)
    fast = prefer == "fast" or (prefer == "auto" and mean >= 0.5)
    if fast:
        return {"fast": {"path": "fast", "mean": mean}, "rescore": None}
    conf = 0.2
    for it in range(4):
        conf = 0.9 if it >= confident_at else conf + 0.1
        if conf >= 0.8:
            break
    return {"fast": None, "rescore": {"iteration": it, "confidence": conf}}
