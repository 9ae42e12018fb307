"""`segue output`, `segue.read_output`, `segue logs` and failure tracebacks in `segue status`.

Everything goes through the real CLI and real controller and worker
processes; the flows fail for real, and the tests read what they printed.
"""

from __future__ import annotations

import json
import os
import re
import select
import time
from pathlib import Path

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

import segue as segue_api

COUNTER = str(FLOWS / "counter.py")
CHATTY = str(FLOWS / "chatty.py")
FAST_RETRY = {"SEGUE_BACKOFF_BASE_S": "0.05"}


def one_line_error(proc, pattern: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert re.fullmatch(rf"segue: {pattern}\n", proc.stderr), proc.stderr


def test_output_of_a_step_cli_json_text_and_python(segue: Segue) -> None:
    segue("run", COUNTER, "--run-id", "o1", "-p", "n=40", "-p", "sleep=0", check=True)
    want = segue.output("o1", "count")  # the engine's own reading of the output reference
    proc = segue("output", "o1", "count", "--json")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {"acc": want["acc"], "i": 40, "hist": want["hist"].tolist()}
    report = segue("output", "o1", "report")
    assert report.returncode == 0 and report.stdout.strip() == repr(
        {"acc2": want["acc"] * 2, "n": 40})
    # The library function, with an explicit home (no environment needed).
    value = segue_api.read_output("o1", "count", home=segue.home)
    assert value["i"] == 40 and value["acc"] == want["acc"]
    assert isinstance(value["hist"], np.ndarray) and (value["hist"] == want["hist"]).all()
    assert "read_output" in segue_api.__all__


def test_output_refuses_unknown_run_step_and_unfinished_step(segue: Segue, tmp_path: Path) -> None:
    one_line_error(segue("output", "o2", "count"), r"no segue home at .*")  # nothing exists yet
    assert not segue.home.exists()  # reading created nothing
    hold = tmp_path / "hold"
    segue("run", COUNTER, "--detach", "--run-id", "o2", "-p", "n=20", "-p", "sleep=0",
          "-p", f"hold={hold}", check=True)
    wait_for(lambda: segue.step("o2", "count")["state"] == "RUNNING", 60, "count to run")
    one_line_error(segue("output", "nope", "count"), r"unknown run 'nope'; .*")
    one_line_error(segue("output", "o2", "nope"),
                   r"run 'o2' has no step 'nope'; its steps: count, report")
    one_line_error(segue("output", "o2", "../../etc"), r"step name '\.\./\.\./etc' is invalid; .*")
    one_line_error(segue("output", "o2", "count"),
                   r"step 'count' of run 'o2' has not succeeded yet \(it is RUNNING\); "
                   r"see `segue status o2`")
    one_line_error(segue("output", "o2", "report"),
                   r"step 'report' of run 'o2' has not succeeded yet \(it is PENDING\); .*")
    with pytest.raises(segue_api.UsageError, match=r"^step 'report' of run 'o2' has not succeeded"):
        segue_api.read_output("o2", "report", home=segue.home)
    hold.touch()
    segue.wait_state("o2", {"SUCCEEDED"}, 60)
    assert json.loads(segue("output", "o2", "report", "--json").stdout)["n"] == 20


def test_logs_per_attempt_and_failure_traceback_in_status(segue: Segue) -> None:
    proc = segue("run", CHATTY, "--run-id", "c1", env=FAST_RETRY)
    assert proc.returncode == 1, proc.stderr  # `bad` fails for good
    first = segue("logs", "c1", "talk", "--attempt", "1")
    assert first.returncode == 0, first.stderr
    assert "hello from attempt 1" in first.stdout and "ValueError: boom at attempt 1" in first.stdout
    assert "attempt 2" not in first.stdout  # one attempt's log only
    # `talk` failed before any checkpoint: its retry counts on, and the reason says no more.
    retry = next(e["reason"] for e in segue.events("c1") if e.get("to_state") == "RETRYING")
    assert "retry 1 of 2 in " in retry and "starts over" not in retry, retry
    second = segue("logs", "c1", "talk", "--attempt", "2").stdout
    assert "hello from attempt 2" in second and "boom" not in second
    both = segue("logs", "c1", "talk").stdout
    assert both.index("==> talk attempt 1 (epoch 1)") < both.index("hello from attempt 1") < \
        both.index("==> talk attempt 2 (epoch 2)") < both.index("hello from attempt 2")
    everything = segue("logs", "c1").stdout
    assert [m.group(1) for m in re.finditer(r"^==> (\w+ attempt \d+)", everything, re.M)] == [
        "talk attempt 1", "talk attempt 2", "gate attempt 1", "bad attempt 1"]
    # Every log lies inside the home's logs directory.
    for line in re.findall(r"^==> .*: (.*) <==$", everything, re.M):
        assert Path(line).resolve().is_relative_to((segue.home / "logs" / "c1").resolve())

    doc = segue.status("c1")
    steps = {s["name"]: s for s in doc["steps"]}
    bad = steps["bad"]["last_failure"]
    assert bad["attempt"] == 1 and bad["error"] == "RuntimeError: always broken"
    assert bad["traceback_tail"][0].startswith("Traceback") or "File" in bad["traceback_tail"][0]
    assert bad["traceback_tail"][-1] == "RuntimeError: always broken"
    assert any('raise RuntimeError("always broken")' in ln for ln in bad["traceback_tail"])
    talk = steps["talk"]["last_failure"]  # it succeeded later; its failure is still on record
    assert talk["attempt"] == 1 and talk["traceback_tail"][-1] == "ValueError: boom at attempt 1"
    assert any("in _deep" in ln for ln in talk["traceback_tail"])
    assert steps["gate"]["last_failure"] is None
    text = segue("status", "c1").stdout
    assert "attempt 1 failed: RuntimeError: always broken" in text
    assert "| RuntimeError: always broken" in text
    assert "segue logs c1 bad --attempt 1" in text
    assert "boom" not in text  # a step that succeeded shows no old traceback


def test_logs_refuse_bad_input_and_paths_outside_the_home(segue: Segue) -> None:
    segue("run", CHATTY, "--run-id", "c2", "-p", "bad=false", env=FAST_RETRY, check=True)
    for step in ("../../segue", "talk/../../x", "/etc/passwd", "talk\n", ".."):
        one_line_error(segue("logs", "c2", step), r"step name .* is invalid; .*")
    one_line_error(segue("logs", "c2", "nope"), r"run 'c2' has no step 'nope'; its steps: talk, gate, bad")
    one_line_error(segue("logs", "c2", "--attempt", "1"), r"--attempt needs a STEP: .*")
    one_line_error(segue("logs", "c2", "talk", "--attempt", "3"),
                   r"step 'talk' of run 'c2' has attempts 1\.\.2; there is no attempt 3")
    one_line_error(segue("logs", "c2", "talk", "--attempt", "0"), r"--attempt must be >= 1, not 0")
    one_line_error(segue("logs", "zz"), r"unknown run 'zz'; .*")
    assert not (segue.home / "logs" / "zz").exists()
    # A home from before per-attempt logs: one file per step, shown as such.
    logs = segue.home / "logs" / "c2"
    (logs / "talk.e1.log").rename(logs / "talk.log")
    older = segue("logs", "c2", "talk")
    assert older.returncode == 0, older.stderr
    assert older.stdout.startswith(f"==> talk earlier attempts (one file): {logs / 'talk.log'} <==\n")
    assert "hello from attempt 1" in older.stdout and "hello from attempt 2" in older.stdout
    missing = segue("logs", "c2", "talk", "--attempt", "1")
    assert missing.returncode == 1 and missing.stdout == ""
    assert re.fullmatch(r"segue: no log of attempt 1 of step 'talk' at .*talk\.e1\.log: .*\n",
                        missing.stderr), missing.stderr


def _read_until(proc, needle: str, timeout: float = 60) -> str:
    """Read the follower's stdout until it shows ``needle`` (no sleeps: select on the pipe)."""
    buf = b""
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while needle.encode() not in buf:
        assert time.monotonic() < deadline, f"no {needle!r} in {buf!r}"
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, f"follower ended before {needle!r}: {buf!r}"
            buf += chunk
    return buf.decode()


def test_logs_follow_prints_as_the_run_goes_and_ends_with_it(segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", CHATTY, "--detach", "--run-id", "c3", "-p", f"gate={gate}", "-p", "bad=false",
          env=FAST_RETRY, check=True)
    wait_for(lambda: segue.step("c3", "gate")["state"] == "RUNNING", 60, "the gate step to run")
    follower = segue.popen("logs", "c3", "--follow")
    try:
        early = _read_until(follower, "waiting for the gate")
        assert "through the gate" not in early  # the run is still going: follow waits
        assert follower.poll() is None
        gate.touch()
        rest, err = follower.communicate(timeout=90)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    out = early + rest
    assert "through the gate" in out and "about to break" in out  # printed after it started
    assert out.count("==> bad attempt 1") == 1
    assert segue.status("c3")["state"] == "SUCCEEDED"
