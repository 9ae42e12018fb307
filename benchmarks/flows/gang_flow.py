"""The gang-checkpoint benchmark's step: ``$BENCH_RANKS`` ranks (1: a plain step), each
holding gang_state.rank_state (``mb`` MiB in ``large`` arrays, and ``small`` arrays of
1 KiB; alone, the step holds both ranks' arrays), checkpointed ``k`` times. The arrays
change before every save, as weights do.

benchmarks.scale conducts every side's saves in turn (benchmarks.scale.Conductor):
each rank says it is ready for save i, and sleeps until the conductor says go; rank 0
times the save (from the point where the ranks met in a collective round, as DCP's
side times from a barrier) until it is committed, and says how long it took."""

import os
import time
from pathlib import Path

from gang_state import rank_state, tell, wait_turn

from segue import Flow

flow = Flow("gangbench", params={"mb": 64, "large": 1, "small": 0, "k": 5, "gate": "", "side": "gang"})
RANKS = int(os.environ.get("BENCH_RANKS", "2"))
KEEP = int(os.environ.get("BENCH_KEEP", "2"))  # benchmarks.scale keeps them all


@flow.step(world_size=RANKS, checkpoint_every="1h", keep_checkpoints=KEEP)
def save(ctx):
    p = ctx.params
    gate, side, k = Path(p["gate"]), p["side"], p["k"]
    state = {}
    for r in range(2) if ctx.world_size == 1 else [ctx.rank]:
        state.update(rank_state(r, p["mb"], p["large"], p["small"]))
    for i in range(k):
        for a in state.values():
            a += 1.0
        wait_turn(gate, side, ctx.rank, i)
        if ctx.world_size > 1:
            # A collective round: the ranks start the timed save together, as DCP's side
            # does after its dist.barrier().
            ctx.checkpoint_due()
        t0 = time.perf_counter()
        ctx.checkpoint(state, durable=True)  # a gang's checkpoint is always durable on return
        if ctx.rank == 0:
            tell(gate, f"done-{side}-{i}={time.perf_counter() - t0!r}")
    wait_turn(gate, side, ctx.rank, k)  # leave only once every side's saves are timed
    return {"k": k}
