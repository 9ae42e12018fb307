"""A data step's changed input is refused at `segue resume`, before anything is written.

The bug this guards: `segue resume` accepted a run whose input had changed
against its pinned snapshot; the step then failed at its start with an error
that no retry can fix, and the run went FAILED saying it "exhausted its
retries". Now the resume itself is refused (exit 2, one line, the run as it
was) when the run's ``on_input_change`` policy, as this resume would set it,
cannot go on; the line says which ``--on-input-change`` would, in the CLI's
spelling, with dates for mtimes, and offers ``include-new`` only when every
change is an added file.

Each run parks deterministically: the first read batch is slow enough for a
checkpoint to be due at its end, a later record waits on a gate that only the
test opens, and the pause ends at the pause deadline.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import Segue, wait_for

from segue.data import InputChangedError, JsonlSource
from segue.data.pinning import reconcile

FLOW = str(Path(__file__).parent / "flows" / "pinned_input.py")
N = 1200
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"


def write_records(path: Path, keys: range, *, gate: Path | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for k in keys:
            rec: dict[str, Any] = {"k": k, "v": f"value-{k:06d}"}
            if gate is not None and k < 520:
                rec["sleep"] = 0.001  # the first read batch takes > 0.5 s: a checkpoint is due
            if gate is not None and k == 700:
                rec["hold"] = str(gate)  # in the second read batch: after that checkpoint
            f.write(json.dumps(rec) + "\n")


def keys_out(out: Path) -> list[int]:
    return sorted(json.loads(line)["k"] for p in out.glob("part-*.jsonl") for line in p.read_text().splitlines())


def park(segue: Segue, run: str, inp: Path, out: Path, gate: Path) -> None:
    """Start the run, wait for its first checkpoint, pause it (held: ends at the deadline)."""
    write_records(inp / "a.jsonl", range(N), gate=gate)
    segue("run", FLOW, "--run-id", run, "--detach", "--pause-deadline", "1", "-p", f"input={inp}",
          "-p", f"out={out}", check=True)
    wait_for(lambda: segue.step(run, "upper")["last_checkpoint"], 120, "the first checkpoint")
    assert segue("pause", run, "--wait", "--timeout", "60").returncode == 0
    assert segue.status(run)["state"] == "PAUSED"


def at_rest(segue: Segue, run: str) -> tuple[Any, ...]:
    """What a refused command must leave as it was: the run's state, options and events."""
    from segue.home import Home

    options = Home.resolve(segue.home).open_store().get_run(run).options
    return segue.status(run)["state"], options, segue.events(run)


def refused(segue: Segue, *args: str) -> str:
    proc = segue("resume", *args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("segue: "), proc.stderr
    return proc.stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_appended_file_is_refused_at_resume_and_pin_goes_on(tmp_path: Path, workers: str) -> None:
    segue = Segue(tmp_path / "home")
    segue.env["PINNED_WORKERS"] = workers
    inp, out, gate = tmp_path / "in", tmp_path / "out", tmp_path / "gate"
    park(segue, "r", inp, out, gate)
    with open(inp / "a.jsonl", "a") as f:  # someone appends while the run is paused
        f.write(json.dumps({"k": 10**6, "v": "late"}) + "\n")
    before = at_rest(segue, "r")

    err = refused(segue, "r")
    assert "input of step 'upper' changed since the run began (modified " in err, err
    assert re.search(rf"a\.jsonl \(mtime {ISO} -> {ISO}, size \d+ -> \d+\)\)", err), err
    assert "`--on-input-change pin`" in err, err
    # An appended file is modified: include-new would refuse it too, so it is not offered.
    assert "--on-input-change include-new" not in err, err
    assert "include-new accepts new files only" in err, err
    assert at_rest(segue, "r") == before  # nothing written: still PAUSED, same options and events

    err = refused(segue, "r", "--on-input-change", "include-new")
    assert "--on-input-change include-new" not in err and "`--on-input-change pin`" in err, err
    assert at_rest(segue, "r") == before  # the policy of a refused resume is not stored

    gate.write_text("")
    proc = segue("resume", "r", "--on-input-change", "pin")
    assert proc.returncode == 0, proc.stderr
    assert keys_out(out) == list(range(N))  # read as pinned: the appended record is not


def test_an_added_file_offers_include_new(tmp_path: Path) -> None:
    segue = Segue(tmp_path / "home")
    inp, out, gate = tmp_path / "in", tmp_path / "out", tmp_path / "gate"
    park(segue, "r", inp, out, gate)
    write_records(inp / "b.jsonl", range(N, N + 50))
    before = at_rest(segue, "r")
    err = refused(segue, "r")
    assert "changed since the run began (added " in err and "b.jsonl" in err, err
    assert "`--on-input-change include-new`" in err and "`--on-input-change pin`" in err, err
    assert at_rest(segue, "r") == before
    gate.write_text("")
    proc = segue("resume", "r", "--on-input-change", "include-new")
    assert proc.returncode == 0, proc.stderr
    assert keys_out(out) == list(range(N + 50))


def test_a_non_retryable_error_fails_the_run_at_once_with_that_error(segue: Segue, tmp_path: Path) -> None:
    """The run's FAILED reason is the step's error, not "exhausted its retries" (retries=200)."""
    flow = str(Path(__file__).parent / "flows" / "mapdecor.py")
    inp = tmp_path / "in" / "data.jsonl"
    inp.parent.mkdir()
    inp.write_text("".join(json.dumps({"k": k, "v": "x", "bad": k % 3 == 0}) + "\n" for k in range(100)))
    proc = segue("run", flow, "--run-id", "dl", "-p", f"input={inp}", "-p", f"out={tmp_path / 'out'}")
    assert proc.returncode == 1, proc.stderr
    assert segue.step("dl", "upper")["attempts"] == 1
    failed = [e for e in segue.events("dl") if e["kind"] == "run" and e["to_state"] == "FAILED"]
    assert len(failed) == 1
    reason = failed[0]["reason"]
    assert "exhausted" not in reason, reason
    assert reason.startswith("step upper failed (not retryable): DeadLetterThresholdError: "), reason


def test_the_run_time_message_agrees(tmp_path: Path) -> None:
    """What the step raises when the input changes after the resume check: same advice."""
    write_records(tmp_path / "in" / "a.jsonl", range(10))
    src = JsonlSource(str(tmp_path / "in"))
    pin = src.snapshot()
    write_records(tmp_path / "in" / "b.jsonl", range(10, 20))
    with pytest.raises(InputChangedError) as added:
        reconcile(pin, src.snapshot(), "fail", "s")
    assert "`--on-input-change include-new`" in str(added.value), added.value
    with open(tmp_path / "in" / "a.jsonl", "a") as f:
        f.write(json.dumps({"k": 99, "v": "late"}) + "\n")
    os.utime(tmp_path / "in" / "a.jsonl", (1.7e9, 1.7e9))
    with pytest.raises(InputChangedError) as modified:
        reconcile(pin, src.snapshot(), "include-new", "s")
    msg = str(modified.value)
    assert re.search(rf"mtime {ISO} -> 2023-11-14T22:13:20(\.0+)?Z, size \d+ -> \d+\)", msg), msg
    assert "--on-input-change include-new" not in msg and "`--on-input-change pin`" in msg, msg
    assert "on_input_change=" not in msg  # the CLI's spelling, not the Python keyword
    os.remove(tmp_path / "in" / "a.jsonl")
    with pytest.raises(InputChangedError) as removed:
        reconcile(pin, src.snapshot(), "pin", "s")
    msg = str(removed.value)
    assert "removed " in msg and "--on-input-change" not in msg and "`--restart-step s`" in msg, msg
