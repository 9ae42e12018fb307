"""torch.distributed.checkpoint's side of ``benchmarks.scale``: two gloo ranks, each saving
its own arrays (benchmarks/flows/gang_state.py) K times with ``dcp.save`` (files
fsynced, its metadata written by rank 0), each save when the conductor says, timed
from a barrier to the end of the save. Configured for speed (:func:`fast_options`).
Run as a script by the benchmark:

    _dcp_save.py PORT MB LARGE SMALL K OUT GATE
"""

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).parent / "flows"))
from gang_state import rank_state, tell, wait_turn  # noqa: E402 - the flows' directory first

SIDE = "dcp"


def fast_options(path: str) -> dict[str, Any]:
    """DCP's fastest configuration here for repeated saves of one state (measured on
    1,000 small and 8 large tensors, torch 2.13): the save plan cached across saves (one
    planner for every save; 0.38-0.40 s a save against 0.48 s without) and two writer
    threads (the same as one there). Its safetensors format was faster still, but
    dcp.load's FileSystemReader cannot read it back (it is for Hugging Face storage), so
    no user saving to load again would pick it. Torch without plan caching gets the
    rest, and the JSON says so (OPTIONS_FILE)."""
    global _planner
    writer = dcp.FileSystemWriter(path, thread_count=2)
    try:
        if _planner is None:
            _planner = dcp.DefaultSavePlanner(enable_plan_caching=True)
    except TypeError:
        return {"storage_writer": writer, "said": "2 writer threads (this torch has no plan caching)"}
    return {"storage_writer": writer, "planner": _planner, "said": FAST}


_planner: Any = None
FAST = "the save plan cached across saves, 2 writer threads"
OPTIONS_FILE = "options.txt"  # in OUT: the options the saves used


def rank_main(rank: int, world: int, port: int, shape: tuple[int, int, int], k: int, out: str,
              gate_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    gate = Path(gate_dir)
    state = {key: torch.from_numpy(a) for key, a in rank_state(rank, *shape).items()}
    for i in range(k):
        for t in state.values():
            t += 1.0
        wait_turn(gate, SIDE, rank, i)
        dist.barrier()
        t0 = time.perf_counter()
        options = fast_options(f"{out}/save-{i}")
        said = options.pop("said")
        dcp.save(state, **options)
        dist.barrier()
        if rank == 0:
            tell(gate, f"done-{SIDE}-{i}={time.perf_counter() - t0!r}")
    if rank == 0:
        Path(out, OPTIONS_FILE).write_text(said)
    wait_turn(gate, SIDE, rank, k)
    dist.destroy_process_group()


if __name__ == "__main__":
    port, mb, large, small, k = map(int, sys.argv[1:6])
    out, gate = sys.argv[6], sys.argv[7]
    os.makedirs(out, exist_ok=True)
    mp.spawn(rank_main, args=(2, port, (mb, large, small), k, out, gate), nprocs=2, join=True)
