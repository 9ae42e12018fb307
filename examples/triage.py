"""Route by confidence: a flow whose path is chosen while it runs, and resumes on it.

list_docs -> score (one task per document) -> route -+-> publish -----------+-> report
                                                     +-> rescore (loop) ----+

* list_docs lists the documents of ``data`` (``*.txt``; where it does not exist, it
  writes a few of its own there): their listing is recorded (``inputs=``), so a resume
  refuses if the directory changed while the run was stopped;
* score runs once per document (``@flow.foreach``): a cheap scorer's label and confidence;
* route takes every confident document to publish, and sends the run to rescore when
  any is not (``ctx.choose``); the side not taken is SKIPPED;
* rescore re-scores the unsure ones with a "larger model" (here: more context), at most
  three times, until every one is confident (``@flow.loop``);
* report writes what was decided, whichever side ran.

    segue run examples/triage.py -p data=/tmp/triage/docs -p out=/tmp/triage
    segue status RUN --items     # the fan-out's tasks
"""

import hashlib
import json
from pathlib import Path

from segue import Flow, Param

flow = Flow("triage", params={
    "data": Param("triage-data", help="a directory of .txt documents (missing: a few are made there)"),
    "out": Param("triage-out", help="where the report goes"),
    "docs": Param(12, help="documents made when data is empty"),
})


def _score(text: str, context: int) -> dict:
    h = int(hashlib.sha256(f"{context}:{text}".encode()).hexdigest()[:8], 16)
    label = ("invoice", "contract", "letter")[h % 3]
    confidence = round(min(0.99, 0.55 + 0.15 * context + (h % 100) / 400), 3)
    return {"label": label, "confidence": confidence}


@flow.step(inputs=["{data}/*.txt"])
def list_docs(ctx):
    data = Path(ctx.params["data"])
    if not data.exists():  # a demo: make some
        data.mkdir(parents=True)
        for i in range(ctx.params["docs"]):
            (data / f"doc-{i:03d}.txt").write_text(f"document {i} " * (i + 1))
    return sorted(str(p) for p in data.glob("*.txt"))


@flow.foreach(over=list_docs, retries=2)
def score(ctx):
    return {"doc": ctx.item, **_score(Path(ctx.item).read_text(), context=0)}


@flow.step(after=[score], choices=["publish", "rescore"])
def route(ctx):
    unsure = [s for s in ctx.inputs["score"] if s["confidence"] < 0.8]
    ctx.choose("rescore" if unsure else "publish")
    return {"scored": ctx.inputs["score"], "unsure": [s["doc"] for s in unsure]}


@flow.step(after=[route])
def publish(ctx):
    return ctx.inputs["route"]["scored"]


@flow.loop(after=[route], until=lambda out: all(s["confidence"] >= 0.8 for s in out), max_iterations=3)
def rescore(ctx):
    before = ctx.previous or ctx.inputs["route"]["scored"]
    return [s if s["confidence"] >= 0.8 else {"doc": s["doc"], **_score(Path(s["doc"]).read_text(),
                                                                           context=ctx.iteration + 1)}
            for s in before]


@flow.step(after=[publish, rescore])
def report(ctx):
    final = ctx.inputs["publish"] or ctx.inputs["rescore"]
    out = Path(ctx.params["out"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(final, indent=1))
    return {"documents": len(final), "path": "publish" if ctx.inputs["publish"] else "rescore",
            "unsure": sum(1 for s in final if s["confidence"] < 0.8)}
