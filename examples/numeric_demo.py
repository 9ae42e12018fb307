"""`make demo-numeric`: run the numeric nightly job twice on the embedded default and prove they agree.

1. an uninterrupted reference run;
2. the same job, detached, which the demo pauses, resumes, SIGKILLs a worker
   of, and resumes again after killing its controller.

Then it compares the final weights and predictions bit for bit and prints the
pause latency and recovery time it measured. Everything goes through the
`segue` command line, as an operator would use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from segue import checkpoint as ckpt
from segue.home import Home

ROOT = Path(__file__).resolve().parent.parent
FLOW = ROOT / "examples" / "nightly.py"
HOME = Path(os.environ.get("SEGUE_HOME", ROOT / ".segue"))
console = Console()


def segue(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEGUE_HOME": str(HOME)}
    proc = subprocess.run([sys.executable, "-m", "segue", *args], capture_output=True, text=True, env=env)
    if check and proc.returncode not in (0, 3):
        console.print(proc.stdout, proc.stderr, markup=False)
        raise SystemExit(f"demo: `segue {' '.join(args)}` exited {proc.returncode}")
    return proc


def status(run_id: str) -> dict:
    return json.loads(segue("status", run_id, "--json").stdout)


def step(doc: dict, name: str) -> dict:
    return next(s for s in doc["steps"] if s["name"] == name)


def wait(pred, what: str, timeout: float = 120.0, poll: float = 0.02):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        got = pred()
        if got:
            return got
        time.sleep(poll)
    raise SystemExit(f"demo: timed out waiting for {what}")


def outputs(run_id: str) -> dict[str, str]:
    """sha256 of every array in the train and score outputs."""
    home = Home.resolve(HOME)
    store, storage = home.open_store(), home.storage()
    digests = {}
    for name in ("train", "score"):
        value = ckpt.load(storage, store.get_task(run_id, name).output_ref).state["value"]
        flat = value["weights"] if name == "train" else {"scores": value["scores"]}
        for k, arr in flat.items():
            digests[f"{name}.{k}"] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()
    return digests


def main() -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    ref, run = f"nightly-ref-{stamp}", f"nightly-{stamp}"
    console.rule("[bold]segue demo: the nightly job")
    console.print(f"home: {HOME}")

    console.print("1/2 reference run, uninterrupted ...")
    t0 = time.monotonic()
    segue("run", str(FLOW), "--run-id", ref)
    clean_s = time.monotonic() - t0
    console.print(f"    done in {clean_s:.1f}s")

    console.print("2/2 the same job, interrupted ...")
    segue("run", str(FLOW), "--run-id", run, "--detach")
    wait(lambda: step(status(run), "train")["last_checkpoint"], "the first train checkpoint")

    t_pause = time.monotonic()
    segue("pause", run, "--wait", "--timeout", "60")
    pause_latency = time.monotonic() - t_pause
    train = step(status(run), "train")
    console.print(f"    paused during train at {train['last_checkpoint']['position']} "
                  f"in {pause_latency:.2f}s (worker gone: {train['pid'] is None})")

    segue("resume", run, "--detach")
    pid = wait(lambda: (s := step(status(run), "train"))["state"] == "RUNNING" and s["pid"]
               and s["last_checkpoint"]["seq"] >= train["last_checkpoint"]["seq"] + 1 and s["pid"],
               "train to run again and checkpoint")
    before = step(status(run), "train")
    os.kill(pid, signal.SIGKILL)
    t_kill = time.monotonic()
    console.print(f"    SIGKILLed the train worker (pid {pid}) at step {before['progress']['done']:.0f}")
    wait(lambda: (s := step(status(run), "train"))["pid"] not in (None, pid) and s["state"] == "RUNNING",
         "train to restart")
    recovery = time.monotonic() - t_kill

    # Finally the controller itself dies (once the restarted train committed a checkpoint,
    # so it dies mid-work on any machine, fast or slow); `segue resume` picks the run up.
    restarted = step(status(run), "train")["attempts"]
    doc = wait(lambda: (d := status(run)) and (s := step(d, "train"))["state"] == "RUNNING"
               and s["attempts"] == restarted and s["last_checkpoint"]["seq"] > before["last_checkpoint"]["seq"]
               and d, "the restarted train to checkpoint")
    ctl_pid = doc["controller"]["pid"]
    os.kill(ctl_pid, signal.SIGKILL)
    done = step(doc, "train")["progress"]["done"]
    console.print(f"    SIGKILLed the controller (pid {ctl_pid}) during train, at step {done:.0f}")
    segue("resume", run)
    final = status(run)

    same = outputs(ref) == outputs(run)
    table = Table(title="verification")
    table.add_column("check")
    table.add_column("result")
    table.add_row("reference run", status(ref)["state"])
    table.add_row("interrupted run", final["state"])
    table.add_row("train attempts / score attempts",
                  f"{step(final, 'train')['attempts']} / {step(final, 'score')['attempts']}")
    table.add_row("final weights and predictions bit-identical", "[green]yes[/green]" if same else "[red]NO[/red]")
    table.add_row("pause latency (request -> PAUSED, worker gone)", f"{pause_latency:.2f}s")
    table.add_row("recovery (worker SIGKILL -> step running again)", f"{recovery:.2f}s")
    console.print(table)
    ok = same and final["state"] == "SUCCEEDED" and status(ref)["state"] == "SUCCEEDED"
    console.print("[bold green]demo passed[/bold green]" if ok else "[bold red]demo FAILED[/bold red]")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
