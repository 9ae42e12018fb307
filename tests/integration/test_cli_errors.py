"""Bad input gets one clear line on stderr, exit code 2, and nothing written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue


def one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    return lines[0]


def write(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text(body)
    return str(p)


HEADER = "from segue import Flow\nflow = Flow('f')\n"


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        (None, r"^segue: flow file '.*nope\.py' does not exist; pass the path of a \.py file that defines a Flow$"),
        ("def broken(:\n", r"^segue: flow file '.*bad\.py' line 1: .*; fix the syntax and retry$"),
        (HEADER + "@flow.step(after=['b'])\ndef a(ctx): pass\n@flow.step(after=[a])\ndef b(ctx): pass\n",
         r"^segue: flow 'f' has a cycle: (a -> b -> a|b -> a -> b)$"),
        (HEADER + "@flow.step(after=['ghost'])\ndef a(ctx): pass\n",
         r"^segue: step 'a' runs after unknown step 'ghost'; known steps: a$"),
        ("x = 1\n", r"^segue: flow file '.*bad\.py' defines no segue\.Flow; create one with Flow\('name'\)$"),
    ],
    ids=["missing", "syntax", "cycle", "unknown-step", "no-flow"],
)
def test_bad_flow_files(segue: Segue, tmp_path: Path, body: str | None, pattern: str) -> None:
    path = str(tmp_path / "nope.py") if body is None else write(tmp_path, "bad.py", body)
    proc = segue("run", path)
    assert proc.returncode == 2
    assert re.match(pattern, one_line(proc.stderr))
    assert not segue.home.exists(), "nothing may be written for bad input"


def test_bad_param_type_and_unknown_param(segue: Segue) -> None:
    proc = segue("run", str(FLOWS / "counter.py"), "-p", "n=lots")
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        "segue: parameter 'n' expects int, got 'lots'; pass --param n=<int>"
    )
    proc = segue("run", str(FLOWS / "counter.py"), "-p", "m=1")
    assert proc.returncode == 2
    assert one_line(proc.stderr).startswith("segue: unknown parameter 'm'; this flow's parameters: ")
    assert not segue.home.exists()


def test_unknown_run_and_finished_run(segue: Segue) -> None:
    segue("run", str(FLOWS / "counter.py"), "--run-id", "done", "-p", "n=5", "-p", "sleep=0", check=True)
    for cmd in (("status", "ghost"), ("pause", "ghost"), ("resume", "ghost"), ("events", "ghost")):
        proc = segue(*cmd)
        assert proc.returncode == 2, cmd
        assert one_line(proc.stderr) == "segue: unknown run 'ghost'; `segue ls` lists the runs in this home"
    proc = segue("pause", "done")
    assert proc.returncode == 2
    assert one_line(proc.stderr) == "segue: a run cannot go from SUCCEEDED to PAUSING; the run already finished"
    proc = segue("resume", "done")
    assert proc.returncode == 2
    assert "already succeeded" in one_line(proc.stderr)


def test_invalid_run_id_and_duplicate(segue: Segue) -> None:
    proc = segue("run", str(FLOWS / "counter.py"), "--run-id", "../escape")
    assert proc.returncode == 2
    assert one_line(proc.stderr).startswith("segue: run id '../escape' is invalid")
    segue("run", str(FLOWS / "counter.py"), "--run-id", "r", "-p", "n=3", "-p", "sleep=0", check=True)
    proc = segue("run", str(FLOWS / "counter.py"), "--run-id", "r")
    assert proc.returncode == 2
    assert one_line(proc.stderr) == (
        "segue: run 'r' already exists; pick another --run-id or `segue resume r`"
    )


def test_status_json_shape(segue: Segue) -> None:
    proc = segue("run", str(FLOWS / "counter.py"), "--run-id", "s", "-p", "n=40", "-p", "sleep=0.002")
    assert proc.returncode == 0, proc.stderr
    doc = segue.status("s")
    assert doc["run_id"] == "s" and doc["state"] == "SUCCEEDED"
    count = doc["steps"][0]
    assert count["name"] == "count" and count["state"] == "SUCCEEDED"
    assert count["progress"] == {"done": 40.0, "total": 40.0, "unit": None}
    assert count["attempts"] == 1 and count["pid"] is None
    assert count["last_checkpoint"] is None or {"time", "seq", "position"} <= set(count["last_checkpoint"])
    assert [s["name"] for s in doc["steps"]] == ["count", "report"]


def test_one_error_tree_with_documented_exit_codes() -> None:
    import re as _re

    import segue.data.errors as data_errors
    import segue.errors as errors

    classes = {n: c for n, c in vars(errors).items()
               if isinstance(c, type) and issubclass(c, errors.SegueError) and c is not errors.SegueError}
    assert errors.exit_code(errors.SegueError("x")) == 1
    # Every class is in the documented tree, with the exit code the CLI uses.
    documented = dict(_re.findall(r"(?m)^\s*[│├└─ ]*(\w+Error|InjectedFault)\s+(\d)\b", errors.__doc__))
    assert set(documented) == set(classes), set(documented) ^ set(classes)
    for name, cls in classes.items():
        assert errors.exit_code(cls.__new__(cls)) == int(documented[name]), name
    # The data errors are the same classes, not a second tree; format errors are no ValueErrors.
    for name in ("DataError", "InputChangedError", "DeadLetterThresholdError", "PositionError",
                 "StagedOutputLostError"):
        assert getattr(data_errors, name) is getattr(errors, name)
        assert issubclass(getattr(errors, name), errors.SegueError)
    assert not issubclass(errors.CheckpointFormatError, ValueError)
    # An illegal transition is a race or a bug inside segue, not bad input: not exit 2.
    assert not issubclass(errors.IllegalTransitionError, errors.UsageError)
    assert errors.exit_code(errors.IllegalTransitionError("a run", "SUCCEEDED", "PAUSING")) == 4
    # What the user asked for is refused as bad input, with the same words.
    refused = errors.RunStateError.refusing(
        errors.IllegalTransitionError("a run", "SUCCEEDED", "PAUSING", "the run already finished"))
    assert isinstance(refused, errors.UsageError) and errors.exit_code(refused) == 2
    assert str(refused) == "a run cannot go from SUCCEEDED to PAUSING; the run already finished"
