"""Preemption of a batch run by an urgent one on a shared (virtual) GPU.

    python -m benchmarks.preemption --quick --json

A batch run holds the only GPU; an urgent run arrives. Measured: how long the
urgent run waits for the device, how much work the victim redoes, and how busy
the device stays. Side by side: the kill-and-requeue baseline (what Slurm's
requeue or a plain kill costs the victim: everything it had done) and the
physical floor of starting a worker process. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

from segue.home import Home
from segue.run import ops
from segue.run.options import RunOptions
from segue.scheduler.devices import virtual_gpus
from segue.states import RunState, TaskState

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "preempt_flow.py"






def one_round(tmp: Path, r: int, tick: float, victim_n: int, urgent_n: int) -> dict:
    home = Home.resolve(tmp / f"home{r}")
    store = home.open_store()
    import socket

    store.configure_host(socket.gethostname(), cpus=8, memory=64 << 30,
                         devices=virtual_gpus(1, 80 << 30), source="configured")
    pv, pu = tmp / f"victim{r}", tmp / f"urgent{r}"
    pv.mkdir()
    pu.mkdir()

    def submit(run_id: str, probe: Path, n: int, priority: int) -> None:
        prepared = ops.prepare_run(FLOW, {"probe_dir": str(probe), "tick": tick, "n": n}, run_id=run_id,
                                   options=RunOptions(priority=priority))
        ops.create_run(store, prepared)
        ops.spawn_detached(home, run_id)

    t_start = time.time()
    submit("victim", pv, victim_n, 0)
    pb.wait_until(lambda: pb.started(pv, 1))
    time.sleep(1.5 + 0.37 * r)  # somewhere between two checkpoints
    t0 = time.perf_counter()
    submit("urgent", pu, urgent_n, 300)
    pb.wait_until(lambda: pb.started(pu, 1))
    to_device = time.perf_counter() - t0
    victim_done_at_park = pb.cursor(pv)
    pb.wait_until(lambda: store.get_run("urgent").state == RunState.SUCCEEDED)
    back = pb.wait_until(lambda: (e := store.get_task("victim", "work").epoch) > 1 and pb.started(pv, e))
    lost = (victim_done_at_park - back["from"]) * tick
    pb.wait_until(lambda: store.get_run("victim").state == RunState.SUCCEEDED)
    t_end = time.time()
    busy = 0.0
    for a in store.list_allocations(live_only=False):
        busy += (a.released_at or t_end) - a.since
    return {
        "to_device": to_device, "lost": lost, "restart_lost": victim_done_at_park * tick,
        "utilization": busy / (t_end - t_start),
        "victim_state": store.get_task("victim", "work").state == TaskState.SUCCEEDED,
        "accounting_redone": store.get_stats("victim").get("work_redone_s", 0.0),
    }




def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rounds = 3 if a.quick else 6
    tick = 0.01
    tmp = Path(tempfile.mkdtemp(prefix="segue-preempt-"))
    res = []
    try:
        for r in range(rounds):
            res.append(one_round(tmp, r, tick, victim_n=500, urgent_n=100))
    finally:
        # Leave no controller behind if a round failed.
        for r in range(rounds):
            db = tmp / f"home{r}" / "segue.db"
            if db.exists():
                store = Home.resolve(tmp / f"home{r}").open_store()
                for run in store.list_runs():
                    if run.controller_pid and not run.state.finished:
                        try:
                            os.kill(run.controller_pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
    med = statistics.median
    startup = pb.worker_startup_s()
    out = {
        "time_to_device_s": round(med(x["to_device"] for x in res), 4),
        "victim_lost_work_s": round(max(x["lost"] for x in res), 4),
        "pool_utilization": round(med(x["utilization"] for x in res), 3),
        "pause_point_interval_s": tick,
        "rounds": rounds,
        "time_to_device_vs_target": round(med(x["to_device"] for x in res) / (1.0 + tick), 3),
        "victim_lost_vs_pause_interval": round(max(x["lost"] for x in res) / tick, 2),
        "kill_requeue_lost_work_s": round(med(x["restart_lost"] for x in res), 3),
        "lost_work_vs_kill_requeue": round(max(x["lost"] for x in res) / max(1e-9, med(x["restart_lost"] for x in res)), 4),
        "floor_worker_startup_s": round(startup, 4),
        "time_to_device_vs_worker_startup": round(med(x["to_device"] for x in res) / startup, 2),
        "all_outputs_complete": all(x["victim_state"] for x in res),
        "samples": {k: [round(x[k], 4) for x in res] for k in ("to_device", "lost", "utilization")},
    }
    if not a.json:
        for k, v in out.items():
            print(f"{k:>34}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
