"""Pause, resume and crash-recovery latency of the engine core.

    python -m benchmarks.recovery --quick --json

Measured on a step with a pause point every `tick` (10 ms) and a checkpoint
every second, side by side with the physical floors that bound them: the
start-up time of a bare Python worker process and the fsynced write time of
the step's state. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from segue.home import Home
from segue.run import ops
from segue.states import RunState, TaskState

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "recovery_flow.py"


def _state_write_s(nbytes: int, where: Path) -> float:
    data = np.ones(nbytes // 8)
    t0 = time.perf_counter()
    with open(where / "probe.bin", "wb") as f:
        f.write(data.tobytes())
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def measure(rounds: int, tick: float, state_kb: int, seed: int, scale: float = 1.0) -> dict:
    rnd = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="segue-bench-"))
    pb.private_pool(tmp)
    home = Home.resolve(tmp / "home")
    probe = tmp / "probe"
    probe.mkdir()
    store = home.open_store()
    prepared = ops.prepare_run(FLOW, {"probe_dir": str(probe), "tick": tick, "state_kb": state_kb},
                               run_id="bench")
    ops.create_run(store, prepared)
    ops.spawn_detached(home, "bench")
    task = lambda: store.get_task("bench", "work")  # noqa: E731
    pauses, resumes, recoveries, lost = [], [], [], []
    try:
        for _ in range(rounds):
            # -- pause: request -> stored PAUSED with the worker process gone
            pb.wait_until(lambda: task().state == TaskState.RUNNING and pb.started(probe, task().epoch))
            time.sleep(scale * rnd.uniform(1.2, 2.0))
            pid = task().pid
            t0 = time.perf_counter()
            ops.request_pause(store, "bench")
            pb.wait_until(lambda: store.get_run("bench").state == RunState.PAUSED)
            pb.wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                  b") Z" in Path(f"/proc/{pid}/stat").read_bytes())
            pauses.append(time.perf_counter() - t0)
            # -- resume: request -> the step restored and running again
            epoch = task().epoch
            t0 = time.perf_counter()
            ops.spawn_detached(home, "bench")
            pb.wait_until(lambda: task().epoch > epoch and pb.started(probe, task().epoch))
            resumes.append(time.perf_counter() - t0)
            # -- crash: SIGKILL the worker -> a new attempt restored and running
            time.sleep(scale * rnd.uniform(1.0, 2.5))
            t = task()
            at_kill = pb.cursor(probe)
            t0 = time.perf_counter()
            os.kill(t.pid, signal.SIGKILL)
            back = pb.wait_until(lambda: task().epoch > t.epoch and pb.started(probe, task().epoch), 30)
            recoveries.append(time.perf_counter() - t0)
            lost.append((at_kill - back["from"]) * tick)
        ops.cancel(store, "bench")
    finally:
        run = store.get_run("bench")
        if run.controller_pid:
            try:
                os.kill(run.controller_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    ckpt_bytes = max(c.nbytes for c in store.list_checkpoints("bench", "work"))
    return {
        "pause": pauses, "resume": resumes, "recovery": recoveries, "lost": lost,
        "ckpt_bytes": ckpt_bytes, "tmp": tmp,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="one short round: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    rounds = 1 if a.smoke else 2 if a.quick else 6
    tick, interval = 0.01, 1.0
    m = measure(rounds, tick, 256, a.seed, scale=0.3 if a.smoke else 1.0)
    try:
        startup = pb.worker_startup_s()
        write = _state_write_s(m["ckpt_bytes"], m["tmp"])
    finally:
        shutil.rmtree(m["tmp"], ignore_errors=True)
    med = statistics.median
    out = {
        "pause_latency_s": round(med(m["pause"]), 4),
        "resume_latency_s": round(med(m["resume"]), 4),
        "recovery_s": round(med(m["recovery"]), 4),
        "lost_work_s": round(max(m["lost"]), 4),
        "checkpoint_interval_s": interval,
        "pause_point_interval_s": tick,
        "rounds": rounds,
        "state_bytes": m["ckpt_bytes"],
        "floor_worker_startup_s": round(startup, 4),
        "floor_state_write_s": round(write, 5),
        "pause_vs_target": round(med(m["pause"]) / (1.0 + write), 3),
        "recovery_vs_target": round(med(m["recovery"]) / 2.0, 3),
        "recovery_vs_worker_startup": round(med(m["recovery"]) / startup, 2),
        "lost_work_vs_interval": round(max(m["lost"]) / interval, 3),
        "samples": {k: [round(x, 4) for x in m[k]] for k in ("pause", "resume", "recovery", "lost")},
    }
    if a.smoke:
        out["notes"] = ["--smoke: one short round; figures mean nothing, the run checks it works"]
    if not a.json:
        for k, v in out.items():
            print(f"{k:>28}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
