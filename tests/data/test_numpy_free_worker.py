"""A data step's worker never imports NumPy: its state is JSON, and NumPy's import is
about 0.15 s of every worker start (and of every resume) on a small machine.

A real run through the CLI: checkpoints, a pause, a resume; the record function
writes what the process has imported when it meets the last record.
"""

from __future__ import annotations

import json
from pathlib import Path

from segue_helpers import Segue, wait_for

from segue.home import Home

# @PROBE@ becomes the probe file's path.
FLOW = '''
import json, os, signal, sys, threading, time
from segue import Flow
from segue.data import JsonlSink, JsonlSource

flow = Flow("nonumpy", params={"input": "", "out": ""})
PROBE = @PROBE@


def _write(name, body):
    with open(PROBE + name + ".tmp", "w") as f:
        json.dump(body, f)
    os.replace(PROBE + name + ".tmp", PROBE + name)


def _hold_for_pause():
    # Wait, once, for the controller's pause signal: the pause lands here, whatever
    # the machine's speed, and never after the last record.
    got, previous = threading.Event(), signal.getsignal(signal.SIGUSR1)

    def on_pause(signum, frame):
        got.set()
        previous(signum, frame)  # the worker's own handler sets the pause flag

    signal.signal(signal.SIGUSR1, on_pause)
    _write("-held", {"pid": os.getpid()})
    deadline = time.monotonic() + 300  # a guard: a pause that never comes fails the test, not hangs it
    while not got.wait(0.005) and time.monotonic() < deadline:
        pass
    signal.signal(signal.SIGUSR1, previous)


@flow.map(source=lambda ctx: JsonlSource(ctx.params["input"], shard_bytes=20_000),
          sink=lambda ctx: JsonlSink(ctx.params["out"]), checkpoint_every="50ms")
def up(record):
    if record.get("hold") and not os.path.exists(PROBE + "-held"):
        _hold_for_pause()
    if record.get("last"):
        _write("", {"pid": os.getpid(), "numpy": "numpy" in sys.modules,
                    "fsspec": "fsspec" in sys.modules})
    return {"k": record["k"], "v": record["v"].upper()}
'''


def test_a_data_step_checkpoints_and_resumes_without_numpy(segue: Segue, tmp_path: Path) -> None:
    flow, inp, out, probe = tmp_path / "flow.py", tmp_path / "in.jsonl", tmp_path / "out", tmp_path / "probe"
    flow.write_text(FLOW.replace("@PROBE@", repr(str(probe))))
    n = 4000
    marks = {n // 2: {"hold": True}, n - 1: {"last": True}}
    inp.write_text("".join(json.dumps({"k": i, "v": f"v{i}", **marks.get(i, {})}) + "\n" for i in range(n)))
    segue("run", str(flow), "--detach", "--run-id", "nn", "-p", f"input={inp}", "-p", f"out={out}", check=True)
    wait_for(lambda: Path(str(probe) + "-held").exists(), 120, "the worker to reach the middle record")
    assert segue("pause", "nn", "--wait").returncode == 0
    assert segue.status("nn")["state"] == "PAUSED" and not probe.exists()  # paused mid-input
    proc = segue("resume", "nn")
    assert proc.returncode == 0, proc.stderr
    step = segue.step("nn", "up")
    # The resumed attempt restored the pause's checkpoint and committed its own: without NumPy.
    assert step["attempts"] == 2
    cks = Home.resolve(segue.home).open_store().list_checkpoints("nn", "up")
    assert any(c.epoch == 2 and c.status == "committed" for c in cks)
    seen = json.loads(probe.read_text())
    assert seen == {"pid": seen["pid"], "numpy": False, "fsspec": False}
    rows = [json.loads(x) for p in sorted(out.glob("part-*")) for x in p.read_text().splitlines()]
    assert sorted(r["k"] for r in rows) == list(range(n))  # exactly once across the pause
