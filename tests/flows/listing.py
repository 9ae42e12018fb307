"""A fan-out over the files of a directory, decided from their listing (``inputs=``).

Each item waits for ``go`` (or ``go-INDEX``) in ``hold`` once it wrote ``started-INDEX`` there, so a
test can stop the run while items are in flight and change the directory.
"""

import os
import time
from pathlib import Path

from segue import Flow

flow = Flow("listing", params={"data": "", "hold": ""})


@flow.step(inputs=["{data}/*.txt"])
def list_files(ctx):
    return sorted(p.name for p in Path(ctx.params["data"]).glob("*.txt"))


@flow.foreach(over=list_files)
def measure(ctx):
    hold = ctx.params["hold"]
    open(os.path.join(hold, f"started-{ctx.index}"), "w").close()
    while not any(os.path.exists(os.path.join(hold, g)) for g in ("go", f"go-{ctx.index}")):
        time.sleep(0.02)
    return {"file": ctx.item, "bytes": len((Path(ctx.params["data"]) / ctx.item).read_bytes())}


@flow.step(after=[measure])
def total(ctx):
    return sorted((m["file"], m["bytes"]) for m in ctx.inputs["measure"])
