"""Checkpointing state that lives on a CUDA device (needs a GPU).

    python -m benchmarks.gpu_checkpoint --quick --json

Measured on the same CUDA state: the physical floor (device-to-host copy into
pinned and into pageable memory, a raw fsynced write of the same bytes), segue
(async blocking time, fsynced save, restore back onto the device), and
torch.save of the same tensors plus fsync. Also checks that the restored
tensors are equal and on the device, and that CUDA RNG state round-trips.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

GiB = 1 << 30


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="tiny state: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not any(Path("/dev").glob("nvidia*")):  # no driver device nodes: skip before importing torch
        print(json.dumps({"skipped": "no CUDA device (no GPU): nothing measured"}))
        return
    try:
        import torch
    except ImportError:
        print(json.dumps({"skipped": "torch is not installed; no GPU benchmark"}))
        return
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device (no GPU): nothing measured"}))
        return
    from segue.checkpoint import Checkpointer, LocalStorage, load
    from segue.run import rng

    total = (GiB // 64) if a.smoke else (1 if a.quick else 4) * GiB
    n_large = 4 if a.smoke else 16
    n_small = 50 if a.smoke else 2000
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    state = {f"layer{i}": torch.rand(total // n_large // 4, device=dev, generator=g) for i in range(n_large)}
    state.update({f"norm{i}": torch.rand(256, device=dev, generator=g) for i in range(n_small)})
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    torch.cuda.synchronize()
    tmp = Path(tempfile.mkdtemp(prefix="segue-gpu-"))
    out: dict[str, object] = {"device": torch.cuda.get_device_name(0), "state_gib": round(nbytes / GiB, 3)}
    try:
        # Floors: D2H into pinned and pageable memory; a raw fsynced write of the bytes.
        pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True) for k, v in state.items()}
        for _ in range(2):
            t0 = time.perf_counter()
            for k, v in state.items():
                pinned[k].copy_(v, non_blocking=True)
            torch.cuda.synchronize()
            d2h_pinned = time.perf_counter() - t0
        t0 = time.perf_counter()
        host = {k: v.cpu() for k, v in state.items()}
        d2h_pageable = time.perf_counter() - t0
        # Every side gets the same tries, interleaved; the first round (which sizes
        # segue's reused pinned and host buffers) is reported apart, then best of the rest.
        from concurrent.futures import ThreadPoolExecutor

        from segue.checkpoint.io import DEFAULT_WORKERS

        from ._floors import Layout
        from ._floors import raw_write as raw_write_floor

        storage = LocalStorage(tmp / "segue")
        ck = Checkpointer(storage)
        blocks, totals, raws, torches = [], [], [], []
        lay = Layout([t.numpy() for t in host.values()])  # the floor's files, laid out before the clock
        with ThreadPoolExecutor(DEFAULT_WORKERS) as iopool:  # the writer's thread count
            for i in range(3):
                if i:
                    for v in state.values():
                        v.add_(1.0)  # new content, so nothing is deduplicated away
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                raw_write_floor(tmp / f"raw{i}", lay, iopool)
                raws.append(time.perf_counter() - t0)
                shutil.rmtree(tmp / f"raw{i}")
                t0 = time.perf_counter()
                fut = ck.save_async(f"ckpt/{i + 1}", {"model": state})
                blocks.append(time.perf_counter() - t0)
                fut.result()
                totals.append(time.perf_counter() - t0)
                t0 = time.perf_counter()  # peer: torch.save of the same (device) tensors + fsync
                with open(tmp / "torch.pt", "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
                torches.append(time.perf_counter() - t0)
                (tmp / "torch.pt").unlink()
        ck.close()
        block, save_total = min(blocks[1:]), min(totals[1:])
        raw_write, torch_save = min(raws[1:]), min(torches[1:])
        t0 = time.perf_counter()
        back = load(storage, "ckpt/3").state["model"]
        torch.cuda.synchronize()
        restore = time.perf_counter() - t0
        equal = all(back[k].device.type == "cuda" and torch.equal(back[k], state[k]) for k in state)
        # CUDA RNG: capture, draw, restore, draw again.
        torch.cuda.manual_seed_all(3)
        torch.rand(8, device=dev)
        saved = rng.capture()
        first = torch.rand(8, device=dev)
        rng.restore(json.loads(json.dumps(saved)))
        again = torch.rand(8, device=dev)
        out.update({
            "d2h_pinned_s": round(d2h_pinned, 4),
            "d2h_pageable_s": round(d2h_pageable, 4),
            "raw_fsync_write_s": round(raw_write, 4),
            "segue_block_s": round(block, 4),
            "segue_block_first_save_s": round(blocks[0], 4),
            "segue_save_s": round(save_total, 4),
            "segue_restore_to_gpu_s": round(restore, 4),
            "torch_save_s": round(torch_save, 4),
            "block_vs_d2h_pinned": round(block / d2h_pinned, 3),
            "save_vs_torch_save": round(torch_save / save_total, 3),
            "save_vs_raw_write": round(raw_write / save_total, 3),
            "restored_equal_on_gpu": bool(equal),
            "cuda_rng_roundtrip": bool(torch.equal(first, again)) and "cuda" in saved.get("torch", {}),
            "gpu_mem_allocated_gib": round(torch.cuda.max_memory_allocated() / GiB, 3),
            "tries": "3 interleaved per side; best of the last 2 (the first sizes buffers)",
        })
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not a.json:
        for k, val in out.items():
            print(f"{k:>26}: {val}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
