"""How a fan-out of 10,000 items scales: creating its tasks, and reading the run's status.

``python -m benchmarks.fanout --quick --json`` (median of 3 tries, each in a fresh home):

- ``fanout_10k_create_s``: from the parent committing its list of 10,000 items (its
  event's time) to the controller having recorded the fan-out (10,000 tasks and the
  decision, one store transaction). The run is `segue run` itself, killed by a fault
  point right after the decision's commit; the figure ends when that process is gone,
  so it is an upper bound of the real controller's: noticing the parent's output,
  loading it, the write and its commit. Goal <= 5 s.
- ``status_10k_s``: ``LocalClient.status`` of that run once every item succeeded (each
  item's task moved by the store calls a worker makes: start, complete), what
  `segue status` and the UI read. Goal <= 0.5 s. ``status_10k_pending_s``: the same
  while every item is still pending.

The items are completed through the store, not run: 10,000 worker processes take most
of an hour on two cores and would measure process start, not the fan-out.
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

ROOT = Path(__file__).resolve().parent.parent
FLOW = ROOT / "benchmarks" / "flows" / "fanout_flow.py"
GOALS = {"fanout_10k_create_s": 5.0, "status_10k_s": 0.5}


def one_try(work: Path, n: int, reads: int) -> dict[str, Any]:
    from segue.client import LocalClient
    from segue.states import Actor, TaskState

    home = work / "home"
    env = {**os.environ, "SEGUE_HOME": str(home), "SEGUE_FAULTS": "controller.after_decision:kill:1",
           "SEGUE_FAULTS_IN": "controller", "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    env.pop("SEGUE_STORE", None)
    proc = subprocess.run([sys.executable, "-m", "segue", "run", str(FLOW), "--run-id", "f", "-p", f"n={n}"],
                          env=env, capture_output=True, text=True, timeout=600)
    gone = time.time()  # the controller was killed right after the decision's commit
    if proc.returncode != -9:
        raise SystemExit(f"the run was to stop at the fan-out's decision; it exited {proc.returncode}: "
                         f"{proc.stderr[-2000:]}")
    client = LocalClient(home, actor=Actor.CLI)
    store = client.store
    events = store.list_events("f")
    parent = next(e for e in events if e.step == "list_items" and e.to_state == "SUCCEEDED")
    decision = next(e for e in events if e.kind == "decision" and e.step == "handle")
    items = [t.step for t in store.get_tasks("f") if t.step.startswith("handle.")]
    assert len(items) == n == decision.data["added"], (len(items), n)

    def timed_status() -> float:
        t0 = time.perf_counter()
        st = client.status("f")
        took = time.perf_counter() - t0
        folded = st.step("handle").items
        assert folded is not None and folded["total"] == n
        return took

    pending = statistics.median(timed_status() for _ in range(reads))
    for name in items:  # what each item's worker writes: its attempt, then its output
        rec = store.start_attempt("f", name, ttl_s=60, actor=Actor.CONTROLLER)
        store.complete_task("f", name, rec.epoch, output_ref=None, actor=Actor.WORKER)
    assert all(t.state == TaskState.SUCCEEDED for t in store.get_tasks("f") if t.step in set(items))
    done = statistics.median(timed_status() for _ in range(reads))
    # An upper bound: until the controller, killed right after its commit, was gone.
    return {"create_s": gone - parent.time, "status_pending_s": pending, "status_done_s": done}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fanout")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="10,000 items, 3 tries")
    mode.add_argument("--smoke", action="store_true", help="300 items, 1 try: checks it runs (CI)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--items", type=int, default=None)
    ap.add_argument("--tries", type=int, default=None)
    a = ap.parse_args(argv)
    n = a.items or (300 if a.smoke else 10_000)
    tries = a.tries or (1 if a.smoke else 3)
    runs = []
    for _ in range(tries):
        work = Path(tempfile.mkdtemp(prefix="segue-bench-fanout-"))
        try:
            runs.append(one_try(work, n, reads=1 if a.smoke else 3))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def fig(key: str) -> tuple[float, list[float]]:
        vals = sorted(r[key] for r in runs)
        return round(statistics.median(vals), 4), [round(vals[0], 4), round(vals[-1], 4)]

    create, create_spread = fig("create_s")
    status, status_spread = fig("status_done_s")
    pending, pending_spread = fig("status_pending_s")
    out = {
        "items": n, "tries": tries,
        "fanout_10k_create_s": create, "fanout_10k_create_spread": create_spread,
        "status_10k_s": status, "status_10k_spread": status_spread,
        "status_10k_pending_s": pending, "status_10k_pending_spread": pending_spread,
        "goals": {k: {"target": f"<= {v}", "value": out_v, "met": out_v <= v}
                  for (k, v), out_v in zip(GOALS.items(), (create, status), strict=True)},
    }
    if a.smoke:
        out["notes"] = [f"--smoke: {n} items, one try; figures mean nothing, the run checks it works"]
    if not a.json:
        for k, v in out.items():
            print(f"{k:>28}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
