"""Partial preemption: an urgent one-GPU run arrives while a batch map step holds 3 GPUs.

    python -m benchmarks.elastic --quick --json

Two sides, the same batch job and the same urgent run, through the real engine
(`segue run`, controllers, coordinators, sub-worker processes, a host pool of 3
virtual GPUs):

* **partial**: the batch step is elastic (``workers=(1, 3)``); the urgent run
  takes one sub-worker's device and the batch run keeps going on two, then
  grows back;
* **whole**: the batch step has a fixed size (``workers=3``); the urgent run
  pauses it whole, as Dataflow and Kueue preempt whole jobs, and it resumes
  by itself afterwards.

Measured on each side: the urgent run's time to its device, the batch run's
throughput while the urgent run holds a device (as a fraction of its rate
before), and the batch run's wall time. The floor beside them is the start-up
of a worker process. Both sides' outputs are checked exactly once and equal
before any ratio is printed. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import _probe as pb

ROOT = Path(__file__).parent
BATCH = ROOT / "flows" / "elastic_flow.py"
URGENT = ROOT / "flows" / "preempt_flow.py"


def _segue(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "segue", *args], capture_output=True, text=True,
                          env=env, timeout=timeout)
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"segue {' '.join(args)} -> {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return proc


def _status(env: dict[str, str], run: str) -> dict[str, Any]:
    return json.loads(_segue(env, "status", run, "--json").stdout)


def _done(env: dict[str, str], run: str) -> float:
    return float(_status(env, run)["steps"][0]["progress"]["done"] or 0)


def _wait(pred: Any, timeout: float, what: str) -> Any:
    # Each poll runs the CLI: poll at 20 Hz, not the probe's default 500 Hz.
    return pb.wait_until(pred, timeout, poll=0.05, what=what)


def _workers(env: dict[str, str], run: str) -> int:
    ev = [e for e in json.loads(_segue(env, "events", run, "--json").stdout) if e["kind"] == "scale"]
    return ev[-1]["data"]["workers"] if ev else 1


def one_side(tmp: Path, side: str, n: int, delay: float, urgent_n: int, smoke: bool = False) -> dict[str, Any]:
    root = tmp / side
    out = root / "out"
    env = {**os.environ, "SEGUE_HOME": str(root / "home"), "SEGUE_POOL": str(root / "pool.db"),
           "ELASTIC_BENCH_WORKERS": "1,3" if side == "partial" else "3",
           "ELASTIC_BENCH_DELAY": str(delay), "PYTHONUNBUFFERED": "1"}
    probe = root / "probe"
    probe.mkdir(parents=True)
    _segue(env, "pool", "set", "--gpus", "3", "--gpu-mem", "80GB", "--cpus", "8")
    t0 = time.monotonic()
    _segue(env, "run", str(BATCH), "--detach", "--run-id", "batch", "--priority", "batch",
           "-p", f"n={n}", "-p", f"out={out}")
    if side == "partial":
        _wait(lambda: _workers(env, "batch") == 3, 300, "the elastic step to grow to 3")
    # A rate before the urgent run, at full size: the last sub-worker has started (its
    # process imports for a while after the scale event), on both sides alike.
    _wait(lambda: _done(env, "batch") > 0, 300, "batch progress")
    time.sleep(2.0)
    d0, s0 = _done(env, "batch"), time.monotonic()
    time.sleep(2.0)
    d1, s1 = _done(env, "batch"), time.monotonic()
    rate_before = (d1 - d0) / (s1 - s0)
    # A figure needs the urgent run to land mid-batch. The smoke run only checks the
    # harness, and on a loaded machine (CI) the batch may be far along by now: it goes on.
    if d1 > 0.6 * n and not smoke:
        raise RuntimeError("the batch run is nearly done before the urgent run: raise n")
    submitted = time.time()  # the probe's start time is wall time too
    _segue(env, "run", str(URGENT), "--detach", "--run-id", "urgent", "--priority", "urgent",
           "-p", f"n={urgent_n}", "-p", "tick=0.01", "-p", f"probe_dir={probe}")
    started = _wait(lambda: (pb.started(probe, 1) or {}).get("t"), 300, "the urgent run to start")
    to_device = started - submitted
    u0 = _done(env, "batch")
    ut0 = time.monotonic()
    _wait(lambda: _status(env, "urgent")["state"] == "SUCCEEDED", 300, "the urgent run to finish")
    u1, ut1 = _done(env, "batch"), time.monotonic()
    rate_during = (u1 - u0) / (ut1 - ut0)
    _wait(lambda: _status(env, "batch")["state"] == "SUCCEEDED", 600, "the batch run to finish")
    wall = time.monotonic() - t0
    rows = [json.loads(line) for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]
    ks = sorted(r["k"] for r in rows)
    acct = _status(env, "batch")["accounting"]
    return {"to_device": to_device, "rate_before": rate_before, "rate_during": rate_during,
            "during_fraction": rate_during / rate_before if rate_before else 0.0, "wall": wall,
            "exactly_once": ks == list(range(n)) and all(r["v"] == (r["k"] * 2654435761) % 2**32
                                                          for r in rows),
            "output": sorted((r["k"], r["v"]) for r in rows),
            "preemptions": acct["preemptions"], "partial_preemptions": acct["partial_preemptions"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="one short round: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    tries = 1 if a.smoke or a.quick else 3
    n, delay, urgent_n = (9000, 0.004, 100) if a.smoke else (9000, 0.004, 300)
    tmp = Path(tempfile.mkdtemp(prefix="segue-elastic-"))
    res: dict[str, list[dict[str, Any]]] = {"partial": [], "whole": []}
    try:
        for t in range(tries):
            for side in ("partial", "whole") if t % 2 == 0 else ("whole", "partial"):  # interleaved
                res[side].append(one_side(tmp / f"try{t}", side, n, delay, urgent_n, a.smoke))
    finally:
        for side in ("partial", "whole"):
            for t in range(tries):
                home = tmp / f"try{t}" / side / "home"
                if home.exists():
                    env = {**os.environ, "SEGUE_HOME": str(home),
                           "SEGUE_POOL": str(tmp / f"try{t}" / side / "pool.db")}
                    for run in ("batch", "urgent"):
                        subprocess.run([sys.executable, "-m", "segue", "cancel", run], env=env,
                                       capture_output=True, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)
    p, w = res["partial"], res["whole"]
    assert p[0]["output"], "the batch wrote no record: nothing was compared"
    assert all(x["exactly_once"] for x in p + w), "an output was not exactly once"
    assert all(x["output"] == p[0]["output"] for x in p + w), "the two sides' outputs differ"
    # A figure needs the preemption to have happened; the smoke run checks the harness only
    # (a loaded machine may finish the batch first), its outputs still exactly once and equal.
    if not a.smoke:
        assert all(x["partial_preemptions"] >= 1 and x["preemptions"] == 0 for x in p)
        assert all(x["preemptions"] >= 1 for x in w)
    med = statistics.median
    startup = pb.worker_startup_s()
    out = {
        "benchmark": "elastic", "tries": tries, "records": n, "record_cost_s": delay,
        "partial_time_to_device_s": round(med(x["to_device"] for x in p), 3),
        "whole_time_to_device_s": round(med(x["to_device"] for x in w), 3),
        "partial_batch_rate_during_urgent": round(med(x["during_fraction"] for x in p), 3),
        "whole_batch_rate_during_urgent": round(med(x["during_fraction"] for x in w), 3),
        "partial_batch_wall_s": round(med(x["wall"] for x in p), 2),
        "whole_batch_wall_s": round(med(x["wall"] for x in w), 2),
        "batch_wall_partial_vs_whole": round(med(x["wall"] for x in p) / med(x["wall"] for x in w), 3),
        "floor_worker_startup_s": round(startup, 4),
        "partial_time_to_device_vs_worker_startup": round(med(x["to_device"] for x in p) / startup, 2),
        "outputs_equal": True,
        "preempted": all(x["partial_preemptions"] >= 1 and x["preemptions"] == 0 for x in p)
        and all(x["preemptions"] >= 1 for x in w),
    }
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
