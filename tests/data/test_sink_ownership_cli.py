"""Sink ownership through the real CLI: a second run is refused, overwrite survives SIGKILLs.

Real runs (controller and worker processes, the SQLite store); the kills are
real SIGKILLs at fault points inside the overwrite protocol, and each test
checks the kill landed (the run failed at that point, the files it left).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from segue_helpers import Segue

from segue.data.sinks.owner import published_parts, tag_of

FLOW = str(Path(__file__).parent / "flows" / "owned_out.py")


def write_input(path: Path, n: int, tag: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"k": i, "v": f"{tag}{i}"}) + "\n")
    return path


def run(segue: Segue, run_id: str, inp: Path, out: Path, *extra: str,
        env: dict[str, str] | None = None):
    return segue("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"out={out}", *extra,
                 env=env)


def published(out: Path) -> list[str]:
    names = published_parts(str(out)) or []
    return sorted(json.loads(line)["v"] for n in names for line in (out / n).read_text().splitlines())


def on_disk(out: Path, run_id: str) -> list[str]:
    return sorted(p.name for p in out.glob(f"part-{tag_of(run_id, 'transform')}-*"))


def test_second_run_into_the_same_directory_fails_naming_the_owner(segue: Segue, tmp_path: Path) -> None:
    out = tmp_path / "out"
    a = write_input(tmp_path / "in-a" / "a.jsonl", 300, "a")
    assert run(segue, "nightly-1", a, out).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = run(segue, "nightly-2", a, out)
    assert proc.returncode == 1
    step = segue.step("nightly-2", "transform")
    assert step["state"] == "FAILED" and step["attempts"] == 1
    assert step["error"].startswith("SinkOwnedError: ")
    assert f"{out} belongs to run 'nightly-1' (step 'transform')" in step["error"]
    assert "\n" not in step["error"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert len(published(out)) == 300


def test_second_run_into_the_same_table_fails_naming_the_owner(segue: Segue, tmp_path: Path) -> None:
    out = tmp_path / "out"
    a = write_input(tmp_path / "in-a" / "a.jsonl", 200, "a")
    assert run(segue, "t1", a, out, "-p", "sink=sqlite").returncode == 0
    assert run(segue, "t2", a, out, "-p", "sink=sqlite").returncode == 1
    err = segue.step("t2", "transform")["error"]
    assert "table results belongs to run 't1' (step 'transform')" in err
    with sqlite3.connect(out / "out.db") as c:
        assert c.execute("SELECT COUNT(*), COUNT(DISTINCT k) FROM results").fetchone() == (200, 200)
    assert run(segue, "t3", a, out, "-p", "sink=sqlite", "-p", "mode=overwrite").returncode == 0
    with sqlite3.connect(out / "out.db") as c:
        assert c.execute("SELECT COUNT(*), COUNT(DISTINCT k) FROM results").fetchone() == (200, 200)


@pytest.mark.parametrize("point", ["sink.before_owner_switch", "sink.after_owner_switch"])
def test_overwrite_killed_inside_the_switch_shows_old_or_new_never_a_mix(
        segue: Segue, tmp_path: Path, point: str) -> None:
    out = tmp_path / "out"
    a = write_input(tmp_path / "in-a" / "a.jsonl", 400, "a")
    b = write_input(tmp_path / "in-b" / "b.jsonl", 250, "b")
    assert run(segue, "old", a, out).returncode == 0
    old_files = on_disk(out, "old")
    assert old_files and published(out) == sorted(f"A{i}" for i in range(400))

    proc = run(segue, "new", b, out, "-p", "mode=overwrite",
               env={"SEGUE_FAULTS": f"{point}:kill", "SEGUE_FAULTS_IN": "worker"})
    assert proc.returncode == 1  # the worker was SIGKILLed (retries=0): the kill landed
    assert "SIGKILL" in segue.step("new", "transform")["error"] or "signal" in \
        segue.step("new", "transform")["error"].lower()
    new_files = on_disk(out, "new")
    assert new_files  # its first parts were renamed into place before the kill
    seen = published(out)
    if point == "sink.before_owner_switch":
        # Not switched: readers see exactly the old set; the new parts are invisible.
        assert seen == sorted(f"A{i}" for i in range(400))
        assert on_disk(out, "old") == old_files
    else:
        # Switched: readers see only the new run's parts, although old files are still on disk.
        assert seen and all(v.startswith("B") for v in seen)
        assert on_disk(out, "old") == old_files

    assert segue("resume", "new").returncode == 0
    assert published(out) == sorted(f"B{i}" for i in range(250))
    assert on_disk(out, "old") == []


def test_a_declared_sink_owned_by_another_run_is_refused_at_submit(segue: Segue, tmp_path: Path) -> None:
    flow = str(Path(__file__).parent / "flows" / "mapdecor.py")
    out = tmp_path / "out"
    inp = write_input(tmp_path / "in" / "a.jsonl", 100, "a")
    args = ("-p", f"input={inp}", "-p", f"out={out}")
    assert segue("run", flow, "--run-id", "first", *args).returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = segue("run", flow, "--run-id", "second", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"segue: step 'upper': {out} belongs to run 'first' (step 'upper'); ")
    assert [r["run_id"] for r in segue.json("ls")] == ["first"]  # nothing was created
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
