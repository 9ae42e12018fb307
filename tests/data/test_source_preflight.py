"""A file source that names no file is refused: at `segue run` when declared, at the step's start otherwise.

Through the real CLI (controller and worker processes, the SQLite store) and
the Python client: a glob or a directory that matches no file, or an exact
path that does not exist, is one line and exit 2 with nothing written when
the source is declared with ``@flow.map``; a source built inside the step
function fails the step at its start with the same line (not retried),
where it used to succeed with 0 records or raise a raw FileNotFoundError.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from segue_helpers import Segue

import segue
from segue.data import CsvSource, JsonlSource, ParquetSource
from segue.data.errors import MissingInputError

FLOW = str(Path(__file__).parent / "flows" / "mapdecor.py")
GLOB = "matches no file; check the path or the glob"
EMPTY_DIR = ("holds no input file (names that start with '.' or '_' are skipped); check the path, "
             "or put the files there first")
NO_FILE = "does not exist; check the path"


def write_input(path: Path, n: int = 20) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"k": k, "v": f"v{k}"}) + "\n" for k in range(n)))
    return path


def cases(tmp: Path) -> dict[str, tuple[str, str]]:
    """name -> (the input parameter, the line expected after ``segue: step 'upper': ``)."""
    (tmp / "empty").mkdir()
    (tmp / "only-hidden").mkdir()
    (tmp / "only-hidden" / "_SUCCESS").write_text("")
    (tmp / "only-hidden" / ".a.jsonl.crc").write_text("")
    write_input(tmp / "in" / "a.jsonl")  # a near miss: the glob below looks for .json
    return {
        "glob": (str(tmp / "in" / "*.json"), f"input {str(tmp / 'in' / '*.json')!r} {GLOB}"),
        "relative-glob": ("in/*.json", f"input 'in/*.json' {GLOB} (relative paths resolve from the "
                                       f"working directory, {tmp})"),
        "empty-dir": (str(tmp / "empty"), f"input directory {str(tmp / 'empty')!r} {EMPTY_DIR}"),
        "hidden-only-dir": (str(tmp / "only-hidden"),
                            f"input directory {str(tmp / 'only-hidden')!r} {EMPTY_DIR}"),
        "missing-file": (str(tmp / "in" / "b.jsonl"), f"input file {str(tmp / 'in' / 'b.jsonl')!r} {NO_FILE}"),
    }


@pytest.mark.parametrize("case", ["glob", "relative-glob", "empty-dir", "hidden-only-dir", "missing-file"])
def test_a_declared_source_naming_no_file_is_refused_at_submit(
        segue: Segue, tmp_path: Path, case: str) -> None:
    inp, expected = cases(tmp_path)[case]
    out = tmp_path / "out"
    listing = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run([sys.executable, "-m", "segue", "run", FLOW, "-p", f"input={inp}", "-p",
                           f"out={out}"], capture_output=True, text=True, env=segue.env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"segue: step 'upper': {expected}\n", proc.stderr
    assert not segue.home.exists(), "a refused run must not create the home"
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no output directory either


def test_the_python_client_refuses_it_too_and_creates_no_run(tmp_path: Path, _test_pool: Path) -> None:
    client = segue.Client(tmp_path / "home", pool=_test_pool)
    inp = str(tmp_path / "nowhere" / "*.jsonl")
    with pytest.raises(segue.UsageError) as refused:
        client.submit(FLOW, {"input": inp, "out": str(tmp_path / "out")}, run_id="r1")
    assert str(refused.value) == f"step 'upper': input {inp!r} {GLOB}"
    assert client.runs() == []
    assert not (tmp_path / "out").exists()


# A step that builds its source itself: only its start can see the input.
INNER = """\
from segue import Flow
from segue.data import JsonlSink, JsonlSource, run_map

flow = Flow("inner", params={"input": "", "out": ""})


@flow.step(retries=3)
def copy(ctx):
    return run_map(ctx, JsonlSource(ctx.params["input"]), dict, JsonlSink(ctx.params["out"]))
"""


@pytest.mark.parametrize("case", ["glob", "empty-dir", "missing-file"])
def test_a_source_built_in_the_step_fails_its_start_with_the_same_line(
        segue: Segue, tmp_path: Path, case: str) -> None:
    inp, expected = cases(tmp_path)[case]
    flow = tmp_path / "inner.py"
    flow.write_text(INNER)
    proc = segue("run", str(flow), "--run-id", "r", "-p", f"input={inp}", "-p", f"out={tmp_path / 'out'}")
    assert proc.returncode == 1, proc.stderr  # it used to succeed with 0 records (or be retried)
    step = segue.step("r", "copy")
    assert step["state"] == "FAILED" and step["attempts"] == 1, step  # not retried: retries=3
    assert step["error"] == f"MissingInputError: {expected}", step["error"]


def test_the_same_input_with_files_in_it_goes_on(segue: Segue, tmp_path: Path) -> None:
    """The control: a directory that holds a file is read (and so is a glob matching it)."""
    write_input(tmp_path / "in" / "a.jsonl", 30)
    (tmp_path / "in" / "_SUCCESS").write_text("")
    for run_id, inp in (("dir", tmp_path / "in"), ("glob", tmp_path / "in" / "*.jsonl")):
        out = tmp_path / f"out-{run_id}"
        proc = segue("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"out={out}")
        assert proc.returncode == 0, proc.stderr
        assert segue.output(run_id, "upper")["records_in"] == 30


@pytest.mark.parametrize("make", [JsonlSource, CsvSource, ParquetSource])
def test_every_file_source_refuses_an_input_naming_no_file(tmp_path: Path, make: type) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "x.data").write_text("")
    for urls, line in (
        (str(tmp_path / "*.csv"), f"input {str(tmp_path / '*.csv')!r} {GLOB}"),
        (str(tmp_path / "empty"), f"input directory {str(tmp_path / 'empty')!r} {EMPTY_DIR}"),
        (f"file://{tmp_path}/gone", f"input file {f'file://{tmp_path}/gone'!r} {NO_FILE}"),
        # One entry of a list that names nothing is refused, though the others match.
        ([str(tmp_path / "x.data"), str(tmp_path / "y.data")], f"input file {str(tmp_path / 'y.data')!r} {NO_FILE}"),
    ):
        with pytest.raises(MissingInputError) as refused:
            make(urls).snapshot()
        assert str(refused.value) == line
        assert refused.value.segue_retryable is False


def test_the_submit_probe_lists_and_never_reads(tmp_path: Path) -> None:
    """A Parquet file that is not Parquet passes the probe: it is listed, not opened."""
    from segue.data.preflight import check_sinks
    from segue.flow import load_flow

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(b"not parquet at all")
    flow = tmp_path / "pq.py"
    flow.write_text("from segue import Flow\nfrom segue.data import JsonlSink, ParquetSource\n"
                    "flow = Flow('pq', params={'input': ''})\n"
                    "@flow.map(source=lambda ctx: ParquetSource(ctx.params['input']), "
                    f"sink=JsonlSink({str(tmp_path / 'out')!r}))\n"
                    "def copy(record):\n    return record\n")
    steps = load_flow(flow).flow.steps
    check_sinks(steps, "r", {"input": str(tmp_path / "in")})  # no error: listed only
    (tmp_path / "empty").mkdir()
    with pytest.raises(segue.UsageError, match=r"^step 'copy': input directory .* holds no input file"):
        check_sinks(steps, "r", {"input": str(tmp_path / "empty")})
    with pytest.raises(Exception, match="(?i)parquet"):  # what reading it would have said
        src = ParquetSource(str(tmp_path / "in"))
        src.shards(src.snapshot())
