"""What a coordinated checkpoint of a gang costs, against one rank and torch.distributed.checkpoint;
and what segue's Ray executor costs and recovers, against local processes and Ray Data.

    python -m benchmarks.scale --quick --json
    python -m benchmarks.scale --smoke --json        # tiny sizes, one try each: checks it runs (CI)

Every side saves the same bytes K times, through its real engine. The sides:

- segue's gang step (`segue run`, world_size=2). Each checkpoint is two shards written
  by two rank processes, two votes, the gang manifest and the store record.
- One segue step writing both ranks' bytes in one state (`durable=True`).
- `torch.distributed.checkpoint.save`: two gloo ranks, each saving its own tensor, fsynced.
- The disk floor: the same bytes in one file per rank, written as benchmarks.checkpoint's
  floor writes them (the gang's two writers' threads, writeback started per file,
  fsynced). ``dcp_vs_disk`` is DCP's speed against it, and ``vs_dcp_at_disk_floor``
  the most ``vs_dcp`` a side writing at the floor could reach on this disk.

A save is timed from its call until it is committed, after an ``os.sync()`` on every
side; the two gang sides (segue's, DCP's) time rank 0 from a point where both ranks
met (a collective round of the gang, DCP's ``dist.barrier()``). Each side gets the same number of saves: K per round, in rounds (3; ``--smoke`` 1)
whose order of sides rotates, and each figure is the best of all of a side's saves, as
in benchmarks.checkpoint (medians are printed beside them): this VM's disk has slow
periods that last seconds and hit one side's block of saves but not the next, which
moved a ratio of medians from 0.6 to 2.7 between runs of the same code. Every array changes exactly before every save, so no side can skip a write. The final states of every side are read
back and checked equal before a ratio is printed.

Then the Ray figures of issue 12 (benchmarks/_ray_side.py, in a process and session of
its own), on a local ``ray.cluster_utils`` cluster: a head with num_cpus=0 and worker
nodes of ``--ray-node-cpus`` (3: a step's worker and two sub-workers) logical CPUs each, node health checks every 200 ms,
three missed = dead. Every side gets the same tries (``--quick`` 2, ``--smoke`` 1 on
3,000 records), rounds interleaved; every output is checked (record count and an
order-independent hash, as benchmarks.pipeline's digest) before any ratio is printed,
and a mismatch aborts.

- ``efficiency_2_workers``: the map step of benchmarks/flows/ray_map_flow.py (JSONL ->
  the transform of benchmarks.pipeline -> exactly-once JSONL sink, a checkpoint every
  second) with ``workers=2``, run by the real CLI on local processes over its run on Ray
  (``--executor ray``, one worker node): local work_s / Ray work_s (goal >= 0.8). work_s
  is the task's start to its success in the store. ``ray_workers_s`` and
  ``local_workers_s`` give 1, 2 and 4 workers (4 with a second worker node).
- ``vs_ray_data``: Ray Data on the same cluster, records and transform, limited to 2 CPUs
  (resource_limits), one read block per file, output fsynced, timed from before the
  pipeline to the fsynced output; its time over segue's on Ray with 2 workers (goal >= 1.2).
- ``node_loss_recovery_s``: a step on Ray (benchmarks/flows/ray_loss_flow.py) whose first
  attempt committed a checkpoint loses its node (``remove_node(allow_graceful=False)``, the
  node its attempt log names); the time until the second attempt committed its first
  checkpoint. Goal: at most Ray's node-death detection (``ray_node_death_detection_s``,
  health-check period x failure threshold) + 2 s.

A Ray side that fails or makes no progress for a while (``--ray-stall``) is null, its
reason under ``not_measured``; without Ray (or Ray Data) installed, so are its figures,
and the rest still runs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "gang_flow.py"
DCP = Path(__file__).parent / "_dcp_save.py"
ROOT = Path(__file__).resolve().parent.parent
# Ray's node health checks on the benchmark's cluster: a lost node is declared dead
# after HEALTH_FAILURES missed checks, one every HEALTH_PERIOD_MS.
HEALTH_PERIOD_MS, HEALTH_FAILURES = 200, 3
RAY_FIGURES = ("efficiency_2_workers", "vs_ray_data", "node_loss_recovery_s")
# Printed whether or not Ray ran (null when it did not).
RAY_KEYS = (*RAY_FIGURES, "ray_node_death_detection_s", "ray_workers_s", "local_workers_s", "ray_data_2w_s",
            "ray_cluster")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _expected(rank: int, mb: int, k: int) -> np.ndarray:
    """Every side's final state: gang_flow.initial, then k exact float32 increments."""
    n = mb * 2**20 // 4
    return (np.arange(n, dtype=np.int64) % 2**20 + rank * 2**20 + k).astype(np.float32)


def segue_side(tmp: Path, ranks: int, mb: int, k: int) -> tuple[list[float], dict[str, np.ndarray]]:
    """`segue run` of the flow with $BENCH_RANKS ranks; the per-save times and the final
    state read back from the last committed checkpoint (every rank's shard)."""
    from segue import checkpoint as ckpt
    from segue.home import Home

    home, probe = tmp / f"home{ranks}", tmp / f"probe{ranks}"
    probe.mkdir()
    env = {**os.environ, "SEGUE_HOME": str(home), "SEGUE_POOL": str(tmp / f"pool{ranks}.db"),
           "BENCH_RANKS": str(ranks)}
    proc = subprocess.run([sys.executable, "-m", "segue", "run", str(FLOW), "--run-id", "b", "-p", f"mb={mb}",
                           "-p", f"k={k}", "-p", f"probe={probe}"], env=env, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"segue run ({ranks} ranks) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    times = json.loads((probe / "times.json").read_text())
    h = Home.resolve(home)
    store = h.open_store()
    storage = h.run_storage(store.get_run("b"))
    last = store.list_checkpoints("b", "save")[0]
    state: dict[str, np.ndarray] = {}
    if ranks == 1:
        state.update(ckpt.load(storage, last.path).state["state"])
    else:
        for r in ckpt.load(storage, last.path).state["state"]["gang"]["ranks"]:
            state.update(ckpt.load(storage, r["path"]).state["state"])
    store.close()
    return times, state


def dcp_side(tmp: Path, mb: int, k: int) -> tuple[list[float], dict[str, np.ndarray]] | str:
    try:
        import torch
        import torch.distributed.checkpoint as dcp
    except ImportError:
        return "torch is not installed"
    out = tmp / "dcp"
    proc = subprocess.run([sys.executable, str(DCP), str(_free_port()), str(mb), str(k), str(out)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return f"torch.distributed.checkpoint failed: {proc.stderr[-500:]}"
    n = mb * 2**20 // 4
    back = {f"rank{r}": torch.zeros(n, dtype=torch.float32) for r in range(2)}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(back, checkpoint_id=str(out / f"save-{k - 1}"))
    return json.loads((out / "times.json").read_text()), {key: t.numpy() for key, t in back.items()}


def disk_floor(tmp: Path, mb: int, k: int) -> list[float]:
    """The same bytes as one save of the gang, one file per rank, written as
    benchmarks.checkpoint's floor writes them (each file's writeback started once
    written, fsynced in parallel), by as many threads as the gang's two writers
    together (each rank writes its shard with segue's thread count)."""
    from segue.checkpoint.io import DEFAULT_WORKERS

    from ._floors import Layout, raw_write

    state = [_expected(r, mb, 0) for r in range(2)]
    times = []
    with ThreadPoolExecutor(2 * DEFAULT_WORKERS) as pool:
        for i in range(k):
            for a in state:
                a += 1.0
            os.sync()
            t0 = time.perf_counter()
            raw_write(tmp / f"raw-{i}", Layout(state), pool)
            times.append(time.perf_counter() - t0)
    return times


def ray_side(tmp: Path, records: int, tries: int, node_cpus: int, stall_s: float,
             run_timeout: float) -> dict[str, Any] | str:
    """The Ray figures (benchmarks._ray_side, in a session of its own), or why there are none."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'segue[ray]')"
    cmd = [sys.executable, "-m", "benchmarks._ray_side", "--records", str(records), "--tries", str(tries),
           "--work", str(tmp / "ray"), "--node-cpus", str(node_cpus), "--stall", str(stall_s),
           "--timeout", str(run_timeout), "--health-period-ms", str(HEALTH_PERIOD_MS),
           "--health-failures", str(HEALTH_FAILURES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=run_timeout * (8 * tries + 4))
    except BaseException:  # SIGTERM first: it shuts its cluster down and ends its runs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return "the Ray side did not end in time"
    if proc.returncode == 3:  # an output differs: no ratio may be printed
        raise SystemExit(err.strip().splitlines()[-1])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return f"the Ray side failed (exit {proc.returncode}): {err.strip()[-800:]}"
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="tiny states: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ray-node-cpus", type=int, default=3,
                    help="logical CPUs of each Ray worker node (2 sub-workers and their coordinator)")
    ap.add_argument("--ray-stall", type=float, default=None,
                    help="seconds without progress after which a run on Ray counts as stuck")
    a = ap.parse_args(argv)
    mb, k = (1, 2) if a.smoke else (64, 5) if a.quick else (256, 8)
    # This VM's disk has stalls that last seconds: every side saves k times per round, in
    # a rotated order, and the figure is the median of all its saves over the rounds.
    rounds = 1 if a.smoke else 3
    # Enough records that the step's work, not the start of its actors, is timed.
    records, tries = (3000, 1) if a.smoke else (3_000_000, 2) if a.quick else (6_000_000, 3)
    stall = a.ray_stall or (20.0 if a.smoke else 60.0)
    notes = pb.byte_compile_segue()
    want = {f"rank{r}": _expected(r, mb, k) for r in range(2)}
    times: dict[str, list[float]] = {"gang": [], "single": [], "dcp": [], "raw": []}
    dcp_skipped: str | None = None
    tmp = Path(tempfile.mkdtemp(prefix="segue-scale-"))
    try:
        for rnd in range(rounds):
            order = ["gang", "single", "dcp", "raw"]
            order = order[rnd % 4:] + order[: rnd % 4]
            for side in order:
                work = tmp / f"{side}{rnd}"
                work.mkdir()
                got: tuple[list[float], dict[str, np.ndarray]] | str | None = None
                if side == "raw":
                    times["raw"] += disk_floor(work, mb, k)
                elif side == "dcp":
                    got = dcp_side(work, mb, k)
                else:
                    got = segue_side(work, 2 if side == "gang" else 1, mb, k)
                if isinstance(got, str):
                    dcp_skipped = got
                elif got is not None:
                    times[side] += got[0]
                    if got[1].keys() != want.keys() or not all(
                            np.array_equal(got[1][key], w) for key, w in want.items()):
                        raise SystemExit(f"the final state of {side} (round {rnd}) differs from the "
                                         "expected: no ratio is printed")
                shutil.rmtree(work, ignore_errors=True)
        ray = ray_side(tmp, records, tries, a.ray_node_cpus, stall, 180.0 if a.smoke else 900.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gang_t, single_t, raw_t = times["gang"], times["single"], times["raw"]
    med = statistics.median
    gang, single, raw = min(gang_t), min(single_t), min(raw_t)
    out: dict[str, Any] = {
        "bytes_per_save": 2 * mb * 2**20,
        "saves_per_side": k * rounds,
        "rounds": rounds,
        "gang_save_s": round(gang, 4),
        "single_save_s": round(single, 4),
        "raw_write_s": round(raw, 4),
        "median_save_s": {side: round(med(t), 4) for side, t in times.items() if t},
        "gang_ckpt_vs_single": round(gang / single, 3),
        "gang_vs_disk": round(raw / gang, 3),
        "states_equal": True,  # every round's states were checked above; a mismatch exits
        "samples": {"gang": [round(x, 4) for x in gang_t], "single": [round(x, 4) for x in single_t],
                    "raw": [round(x, 4) for x in raw_t]},
    }
    if dcp_skipped is not None:
        out.update({"dcp_save_s": None, "vs_dcp": None, "dcp_vs_disk": None, "vs_dcp_at_disk_floor": None,
                    "dcp_skipped": dcp_skipped})
    else:
        dcp_s = min(times["dcp"])
        # dcp_vs_disk bounds vs_dcp: a side at the disk floor gets vs_dcp = 1 / dcp_vs_disk.
        out.update({"dcp_save_s": round(dcp_s, 4), "vs_dcp": round(dcp_s / gang, 3),
                    "dcp_vs_disk": round(raw / dcp_s, 3), "vs_dcp_at_disk_floor": round(dcp_s / raw, 3)})
        out["samples"]["dcp"] = [round(x, 4) for x in times["dcp"]]
    not_measured: dict[str, str] = {}
    if isinstance(ray, str):
        out.update({key: None for key in RAY_KEYS})
        not_measured.update({key: ray for key in RAY_FIGURES})
    else:
        not_measured.update(ray.pop("ray_skipped", {}))
        out.update(ray)
        for key, side in (("efficiency_2_workers", "ray_2w"), ("vs_ray_data", "ray_data_2w"),
                          ("vs_ray_data", "ray_2w"), ("node_loss_recovery_s", "node_loss_recovery_s")):
            if out[key] is None and side in not_measured and key not in not_measured:
                not_measured[key] = not_measured[side] if side == key else f"see {side}"
    out["not_measured"] = not_measured
    detection = HEALTH_PERIOD_MS * HEALTH_FAILURES / 1000
    out["goals"] = pb.goals(out, {"gang_ckpt_vs_single": ("<=", 1.3), "vs_dcp": (">=", 1.5),
                                  "efficiency_2_workers": (">=", 0.8), "vs_ray_data": (">=", 1.2),
                                  "node_loss_recovery_s": ("<=", round(detection + 2.0, 3))})
    if a.smoke:
        notes.append("--smoke: 1 MiB states, 3,000 records, one try; figures mean nothing, the run "
                     "checks it works")
    out["notes"] = notes
    if not a.json:
        for key, v in out.items():
            print(f"{key:>22}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
