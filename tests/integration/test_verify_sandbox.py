"""`segue verify` never passes on nothing (issue 35 §1).

Its two runs work in sandboxes of their own: a sink parameter given as an
absolute path inside the working directory is remapped into each sandbox,
one outside it is refused before anything runs, a relative input is read
from the working directory, and a verify that compared no record fails. A
3-record JSONL input and no faults keep each test to a few seconds.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue

MAPDECOR = str(FLOWS.parent / "data" / "flows" / "mapdecor.py")  # JSONL in, uppercased, JSONL out


def records(n: int) -> str:
    return "".join(json.dumps({"k": i, "v": f"value-{i}"}) + "\n" for i in range(n))


def workdir(tmp_path: Path, n: int = 3) -> Path:
    """The user's working directory, holding ``small.jsonl`` (``n`` records)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "small.jsonl").write_text(records(n))
    return work


def verify(segue: Segue, work: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`segue verify MAPDECOR -p input=small.jsonl ARGS --kills 0 --pauses 0`, run from ``work``;
    its sandbox (mkdtemp) lands in ``tmp``, where a test can see that it went."""
    tmp.mkdir(exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "segue",
            "verify",
            MAPDECOR,
            "-p",
            "input=small.jsonl",
            *args,
            "--kills",
            "0",
            "--pauses",
            "0",
        ],
        cwd=work,
        env={**segue.env, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def sink_records(directory: Path) -> list[dict]:
    return sorted(
        (
            json.loads(line)
            for p in directory.glob("*.jsonl")
            for line in p.read_text().splitlines()
        ),
        key=lambda r: r["k"],
    )


UPPER = [{"k": i, "v": f"VALUE-{i}"} for i in range(3)]


def test_an_absolute_sink_path_inside_the_working_directory_is_remapped_into_each_sandbox(
    segue: Segue, tmp_path: Path
) -> None:
    work = workdir(tmp_path)
    outside = work / "outabs"
    proc = verify(segue, work, tmp_path / "tmp", "-p", f"out={outside}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "verify: IDENTICAL"
    assert "  records compared 3, lost 0, duplicated 0, differing 0" in lines
    assert (
        f"verify: parameter 'out' ({outside}) is inside the working directory; each run writes it "
        "as outabs in its own sandbox"
    ) in proc.stderr.splitlines()
    assert not outside.exists()  # each run wrote SANDBOX/outabs; the user's path is untouched
    assert sorted(p.name for p in work.iterdir()) == ["small.jsonl"]
    assert list((tmp_path / "tmp").iterdir()) == []  # and the sandbox went


def test_a_relative_input_is_read_from_the_working_directory_and_a_relative_sink_stays_in_the_sandbox(
    segue: Segue, tmp_path: Path
) -> None:
    work = workdir(tmp_path)
    earlier = work / "out" / "upper"  # the flow's default sink, left by an earlier `segue run`
    earlier.mkdir(parents=True)
    (earlier / "part-old.jsonl").write_text(records(1))
    proc = verify(segue, work, tmp_path / "tmp", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert (
        doc["verdict"] == "IDENTICAL"
        and doc["records_compared"] == 3
        and doc["params_remapped"] == {}
    )
    assert [p.name for p in earlier.iterdir()] == [
        "part-old.jsonl"
    ]  # not the runs' sink: untouched


def test_the_two_runs_have_their_own_run_ids_and_their_own_outputs(
    segue: Segue, tmp_path: Path
) -> None:
    work = workdir(tmp_path)
    keep = tmp_path / "keep"
    proc = verify(
        segue, work, tmp_path / "tmp", "-p", f"out={work / 'outabs'}", "--keep", str(keep), "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["verdict"] == "IDENTICAL" and doc["records_compared"] == 3
    assert doc["params_remapped"] == {"out": "outabs"}
    ids = doc["run_ids"]
    assert ids["clean"] != ids["faulted"]
    for side in ("clean", "faulted"):
        # The run id the report names is the one that ran in that sandbox, and its sink is there.
        conn = sqlite3.connect(keep / side / ".segue" / "segue.db")
        try:
            assert conn.execute("SELECT run_id FROM runs").fetchall() == [(ids[side],)]
        finally:
            conn.close()
        assert sink_records(keep / side / "outabs") == UPPER


def test_an_absolute_sink_path_outside_the_working_directory_is_refused_before_anything_runs(
    segue: Segue, tmp_path: Path
) -> None:
    work = workdir(tmp_path)
    elsewhere = tmp_path / "elsewhere" / "x"
    proc = verify(segue, work, tmp_path / "tmp", "-p", f"out={elsewhere}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1, proc.stderr
    assert re.fullmatch(
        rf"segue: parameter 'out' \({re.escape(str(elsewhere))}\) puts the sink of step 'upper' at "
        rf"{re.escape(str(elsewhere))}, outside verify's sandboxes: .*nothing would be compared; "
        r"pass a relative path \(-p out=x\), which each run resolves in its own sandbox",
        err[0],
    ), err[0]
    assert not (tmp_path / "elsewhere").exists()
    assert list((tmp_path / "tmp").iterdir()) == []


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_verify_that_compared_no_record_fails(
    segue: Segue, tmp_path: Path, as_json: bool
) -> None:
    work = workdir(tmp_path, n=0)  # both runs succeed, their sinks hold nothing
    proc = verify(segue, work, tmp_path / "tmp", *(["--json"] if as_json else []))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "IDENTICAL" not in proc.stdout
    assert proc.stderr.strip().splitlines()[-1] == (
        "segue: nothing was compared: the flow has sinks, but the clean run's sandbox holds no record "
        "of them; check that its input is not empty and that its sinks write inside the sandbox"
    )
    if as_json:
        doc = json.loads(proc.stdout)
        assert doc["verdict"] == "NOTHING COMPARED" and doc["records_compared"] == 0
        assert doc["ok"] is False and doc["identical"] is False and doc["nothing_compared"] is True
        assert (
            doc["clean_state"] == doc["faulted_state"] == "SUCCEEDED"
        )  # it ran; it proved nothing
    else:
        assert proc.stdout.splitlines()[0] == "verify: NOTHING COMPARED"


def test_ckpt_verify_of_a_run_that_never_checkpointed_fails(segue: Segue) -> None:
    segue("run", str(FLOWS / "stuck_progress.py"), "--run-id", "r", "-p", "sleep=0", check=True)
    run_dir = segue.home / "data" / "runs" / "r"
    assert (
        run_dir.is_dir()
    )  # the premise: the run has a directory (its step's output), no checkpoint
    proc = segue("ckpt", "verify", str(run_dir))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == (
        f"segue: no checkpoint under {run_dir} (nor under {run_dir}/checkpoints); "
        "pass a checkpoint or a directory of them\n"
    )
