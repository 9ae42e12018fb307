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
import shutil
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
from segue.store.hostpool import POOL_ENV
from segue.store.pools import open_pool

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "preempt_flow.py"


def _home_with_gpu(root: Path):  # noqa: ANN202 - (Home, Store)
    """A fresh home, and a host pool of its own with one virtual GPU.

    The pool is machine-wide by default; the benchmark points $SEGUE_POOL (which its
    controllers inherit) at a file of the round's own, so it never touches the
    machine's pool nor competes with other users' runs.
    """
    import socket

    os.environ[POOL_ENV] = str(root.parent / f"{root.name}-pool.db")
    open_pool().configure_host(socket.gethostname(), cpus=8, memory=64 << 30,
                               devices=virtual_gpus(1, 80 << 30), source="configured")
    home = Home.resolve(root)
    return home, home.open_store()


def _submit(home: Home, store, run_id: str, probe: Path, n: int, priority: int,  # noqa: ANN001
            tick: float) -> None:
    prepared = ops.prepare_run(FLOW, {"probe_dir": str(probe), "tick": tick, "n": n}, run_id=run_id,
                               options=RunOptions(priority=priority))
    ops.create_run(store, prepared)
    ops.spawn_detached(home, run_id)


def kill_requeue_round(tmp: Path, r: int, tick: float, victim_n: int, wait_s: float) -> dict:
    """The baseline, measured: the same victim, at the same point, is SIGKILLed (what a
    plain kill or Slurm's requeue does to it) and restarted by the engine from the last
    checkpoint it had. Lost work is where it was minus where the restart resumed."""
    home, store = _home_with_gpu(tmp / f"kr-home{r}")
    probe = tmp / f"kr-victim{r}"
    probe.mkdir()
    _submit(home, store, "victim", probe, victim_n, 0, tick)
    try:
        pb.wait_until(lambda: pb.started(probe, 1))
        time.sleep(wait_s)  # the same moment as the preemption round
        task = store.get_task("victim", "work")
        at_kill = pb.cursor(probe)
        t0 = time.perf_counter()
        os.kill(task.pid, signal.SIGKILL)
        back = pb.wait_until(lambda: (e := store.get_task("victim", "work").epoch) > task.epoch
                             and pb.started(probe, e))
        downtime = time.perf_counter() - t0
        return {"lost": (at_kill - back["from"]) * tick, "downtime": downtime}
    finally:
        ops.cancel(store, "victim")
        pb.wait_until(lambda: not pb.alive(store.get_run("victim").controller_pid))


def one_round(tmp: Path, r: int, tick: float, victim_n: int, urgent_n: int, wait_s: float,
              finish: bool = True) -> dict:
    home, store = _home_with_gpu(tmp / f"home{r}")
    pv, pu = tmp / f"victim{r}", tmp / f"urgent{r}"
    pv.mkdir()
    pu.mkdir()

    def submit(run_id: str, probe: Path, n: int, priority: int) -> None:
        _submit(home, store, run_id, probe, n, priority, tick)

    t_start = time.time()
    submit("victim", pv, victim_n, 0)
    pb.wait_until(lambda: pb.started(pv, 1))
    time.sleep(wait_s)  # somewhere between two checkpoints
    t0 = time.perf_counter()
    submit("urgent", pu, urgent_n, 300)
    pb.wait_until(lambda: pb.started(pu, 1))
    to_device = time.perf_counter() - t0
    victim_done_at_park = pb.cursor(pv)
    pb.wait_until(lambda: store.get_run("urgent").state == RunState.SUCCEEDED)
    back = pb.wait_until(lambda: (e := store.get_task("victim", "work").epoch) > 1 and pb.started(pv, e))
    lost = (victim_done_at_park - back["from"]) * tick
    if finish:
        pb.wait_until(lambda: store.get_run("victim").state == RunState.SUCCEEDED)
    else:  # smoke: the victim is endless (it cannot finish before the preemption); stop it
        ops.cancel(store, "victim")
        pb.wait_until(lambda: not pb.alive(store.get_run("victim").controller_pid))
    t_end = time.time()
    busy = 0.0
    for a in open_pool().list_allocations(live_only=False):
        busy += (a.released_at or t_end) - a.since
    return {
        "to_device": to_device, "lost": lost,
        "utilization": busy / (t_end - t_start),
        "victim_state": (store.get_task("victim", "work").state == TaskState.SUCCEEDED
                         if finish else None),
        "accounting_redone": store.get_stats("victim").get("work_redone_s", 0.0),
    }

def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="one short round: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rounds = 1 if a.smoke else 3 if a.quick else 6
    # smoke: an endless victim, cancelled once it is back, so the urgent run's start-up
    # time (slow on a loaded machine) can never let it finish before being preempted
    victim_n, urgent_n = (10**7, 20) if a.smoke else (500, 100)
    tick = 0.01
    tmp = Path(tempfile.mkdtemp(prefix="segue-preempt-"))
    res, base = [], []
    try:
        for r in range(rounds):
            # somewhere between two checkpoints, a new place each round
            wait_s = (0.5 if a.smoke else 1.5) + 0.37 * r
            res.append(one_round(tmp, r, tick, victim_n, urgent_n, wait_s, finish=not a.smoke))
            base.append(kill_requeue_round(tmp, r, tick, victim_n, wait_s))
    finally:
        # Leave no controller behind if a round failed.
        for name in (f"{p}home{r}" for p in ("", "kr-") for r in range(rounds)):
            db = tmp / name / "segue.db"
            if db.exists():
                store = Home.resolve(tmp / name).open_store()
                for run in store.list_runs():
                    if run.controller_pid and not run.state.finished:
                        try:
                            os.kill(run.controller_pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
        shutil.rmtree(tmp, ignore_errors=True)
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
        # measured: a real SIGKILL at the same moment, restarted from its last checkpoint
        "kill_requeue_lost_work_s": round(med(x["lost"] for x in base), 3),
        "kill_requeue_downtime_s": round(med(x["downtime"] for x in base), 3),
        "lost_work_vs_kill_requeue": round(max(x["lost"] for x in res)
                                           / max(1e-9, med(x["lost"] for x in base)), 4),
        "floor_worker_startup_s": round(startup, 4),
        "time_to_device_vs_worker_startup": round(med(x["to_device"] for x in res) / startup, 2),
        "all_outputs_complete": (None if a.smoke else all(x["victim_state"] for x in res)),
        "samples": {k: [round(x[k], 4) for x in res] for k in ("to_device", "lost", "utilization")},
        "kill_requeue_samples": {k: [round(x[k], 4) for x in base] for k in ("lost", "downtime")},
    }
    if a.smoke:
        out["notes"] = ["--smoke: one short round; figures mean nothing, the run checks it works"]
    if not a.json:
        for k, v in out.items():
            print(f"{k:>34}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
