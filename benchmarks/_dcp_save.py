"""torch.distributed.checkpoint's side of ``benchmarks.scale``: two gloo ranks, each saving
its own ``mb`` MiB tensor K times (``dcp.save``, files fsynced, its metadata written by
rank 0), timed from a barrier to the end of the save. Run as a script by the benchmark."""

import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def rank_main(rank: int, world: int, port: int, mb: int, k: int, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = mb * 2**20 // 4
    t = (torch.arange(n, dtype=torch.int64) % 2**20 + rank * 2**20).to(torch.float32)  # gang_flow.initial
    times = []
    for i in range(k):
        t += 1.0
        os.sync()  # every side starts each timed save on a settled disk
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save({f"rank{rank}": t}, storage_writer=dcp.FileSystemWriter(f"{out}/save-{i}", thread_count=2))
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        with open(f"{out}/times.json", "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    port, mb, k, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.makedirs(out, exist_ok=True)
    mp.spawn(rank_main, args=(2, port, mb, k, out), nprocs=2, join=True)
