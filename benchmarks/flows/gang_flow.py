"""The gang-checkpoint benchmark's step: ``$BENCH_RANKS`` ranks (1: a plain step), each
holding ``mb`` MiB of float32 (``mb * ranks`` in one state when alone), checkpointed
``k`` times; every save is timed (by rank 0, once the ranks met in a collective round,
as DCP's side times from a barrier) from the call until it is committed, and the
times go to ``probe/times.json``. The arrays change before every save, as weights do."""

import json
import os
import time
from pathlib import Path

import numpy as np

from segue import Flow

flow = Flow("gangbench", params={"mb": 64, "k": 5, "probe": ""})
RANKS = int(os.environ.get("BENCH_RANKS", "2"))


def initial(rank: int, n: int) -> np.ndarray:
    # Below 2**22, so every += 1.0 changes every element exactly: past 2**24 a float32
    # increment can round back to the same value, and an unchanged array is a blob
    # segue reuses instead of writing (DCP writes it again): not the same work.
    return (np.arange(n, dtype=np.int64) % 2**20 + rank * 2**20).astype(np.float32)


@flow.step(world_size=RANKS, checkpoint_every="1h", keep_checkpoints=2)
def save(ctx):
    p = ctx.params
    n = p["mb"] * 2**20 // 4
    # Alone, the step holds what every rank of the gang would: the same bytes in total.
    mine = range(2) if ctx.world_size == 1 else [ctx.rank]
    state = {f"rank{r}": initial(r, n) for r in mine}
    times = []
    for _ in range(p["k"]):
        for a in state.values():
            a += 1.0
        os.sync()  # every side starts each timed save on a settled disk
        if ctx.world_size > 1:
            # A collective round: the ranks start the timed save together, as DCP's side
            # does after its dist.barrier(). Without it, rank 0's time included waiting
            # for the other rank's os.sync().
            ctx.checkpoint_due()
        t0 = time.perf_counter()
        ctx.checkpoint(state, durable=True)  # a gang's checkpoint is always durable on return
        times.append(time.perf_counter() - t0)
    if ctx.rank == 0:
        Path(p["probe"], "times.json").write_text(json.dumps(times))
    return {"k": p["k"]}
