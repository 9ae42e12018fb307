"""Data-step settings follow the run, not the environment of whichever process started a worker.

* ``--on-input-change`` is a stored run option: a run created with ``pin``
  and resumed by another controller process, with no such variable in its
  environment, keeps ``pin``; ``segue resume --on-input-change`` changes it.
* The default dead-letter sink lives in the run's home, also with
  ``segue --home X`` run from another working directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from segue_helpers import Segue, wait_for

from segue.home import Home

FLOW = str(Path(__file__).parent / "flows" / "owned_out.py")


def write_file(path: Path, keys: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in keys:
            f.write(json.dumps({"k": i, "v": f"v{i}"}) + "\n")


def keys_out(out: Path) -> list[int]:
    return sorted(json.loads(line)["k"] for p in out.glob("part-*.jsonl") for line in p.read_text().splitlines())


def park_after_first_unit(segue: Segue, run: str, inp: Path, out: Path, hold: Path, *extra: str) -> None:
    """Start the run; its first record waits for a pause, so it parks with the rest of the input to do."""
    segue("run", FLOW, "--run-id", run, "--detach", "-p", f"input={inp}", "-p", f"out={out}",
          "-p", f"hold={hold}", "-p", "hold_k=0", *extra, check=True)
    wait_for(lambda: (t := segue.step(run, "transform"))["state"] == "RUNNING" and t["pid"], 60,
             "the worker to start")
    assert segue("pause", run, "--wait", "--timeout", "60").returncode == 0
    assert segue.step(run, "transform")["last_checkpoint"] is not None
    hold.write_text("")


def test_pin_is_stored_with_the_run_and_kept_by_another_controller(segue: Segue, tmp_path: Path) -> None:
    inp, out, hold = tmp_path / "in", tmp_path / "out", tmp_path / "hold"
    write_file(inp / "a.jsonl", range(0, 600))
    write_file(inp / "b.jsonl", range(600, 1200))
    park_after_first_unit(segue, "pinned", inp, out, hold, "--on-input-change", "pin")
    write_file(inp / "c.jsonl", range(1200, 1300))  # the input changed while the run was paused
    assert "SEGUE_ON_INPUT_CHANGE" not in segue.env
    # A new controller (detached, its own process tree) resumes it, with no policy in its env.
    proc = segue("resume", "pinned", "--detach")
    assert proc.returncode == 0, proc.stderr
    doc = segue.wait_state("pinned", {"SUCCEEDED", "FAILED"}, 120)
    assert doc["state"] == "SUCCEEDED", doc["steps"][0]["error"]
    assert keys_out(out) == list(range(1200))  # the pinned input: c.jsonl ignored
    assert Home.resolve(segue.home).open_store().get_run("pinned").options["on_input_change"] == "pin"


def test_resume_changes_the_stored_policy(segue: Segue, tmp_path: Path) -> None:
    inp, out, hold = tmp_path / "in", tmp_path / "out", tmp_path / "hold"
    write_file(inp / "a.jsonl", range(0, 600))
    park_after_first_unit(segue, "grow", inp, out, hold)
    write_file(inp / "b.jsonl", range(600, 700))
    assert segue("resume", "grow", "--on-input-change", "include-new").returncode == 0
    assert keys_out(out) == list(range(700))
    assert Home.resolve(segue.home).open_store().get_run("grow").options["on_input_change"] == "include-new"
    assert [e["data"]["on_input_change"] for e in segue.events("grow") if e["kind"] == "options"] \
        == ["include-new"]


def test_dead_letters_go_to_the_home_given_with_dash_dash_home(tmp_path: Path) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    write_file(inp / "a.jsonl", range(100))
    home, cwd = tmp_path / "elsewhere" / "home", tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("SEGUE_HOME", "SEGUE_FAULTS")}
    proc = subprocess.run([sys.executable, "-m", "segue", "--home", str(home), "run", FLOW, "--run-id", "dl",
                           "-p", f"input={inp}", "-p", f"out={out}", "-p", "bad_every=10"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    dead = home / "dead-letter" / "dl" / "transform"
    rows = [json.loads(line) for p in dead.glob("dead-part-*.jsonl") for line in p.read_text().splitlines()]
    assert sorted(r["record"]["k"] for r in rows) == list(range(0, 100, 10))
    assert not (cwd / ".segue").exists()
    assert keys_out(out) == [k for k in range(100) if k % 10]
