"""A ``@flow.map`` function that cannot take what its step passes is refused when the flow loads.

Through the real CLI (`python -m segue run FLOW` in a subprocess, a temporary
home): exit 2, one line naming the step, the signature found and the call the
data layer makes, and nothing written: no home, no run, no output directory,
no dead letters. Before, every record failed into the dead-letter sink and the
failed run owned the output directory. The controls run flows whose functions
do fit (a parameter named ``params``, with or without a model, ``*args``, a
builtin whose signature cannot be read) to success over real input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAD = """\
from segue import Flow
from segue.data import JsonlSink, JsonlSource
from segue.inference import ModelHandler

flow = Flow("sig", params={"input": "", "out": ""})
SRC = lambda ctx: JsonlSource(ctx.params["input"])  # noqa: E731
SNK = lambda ctx: JsonlSink(ctx.params["out"])  # noqa: E731


class Same(ModelHandler):
    def load_model(self):
        return None

    def run_inference(self, batch, model):
        return list(batch)


"""
ENDS = ", or fn({}, params) to read the run's params (a parameter named params gets them)"
PLAIN, MODEL = "fn(record)" + ENDS.format("record"), "fn(batch, model)" + ENDS.format("batch, model")

# name -> (the declaration, the one line expected after "segue: ")
REFUSED: dict[str, tuple[str, str]] = {
    "map-no-argument": (
        "@flow.map(source=SRC, sink=SNK)\ndef const():\n    return {}\n",
        "flow.map: step 'const' takes () but a map function must take " + PLAIN),
    "map-other-second-argument": (  # only a parameter named params gets the params
        "@flow.map(source=SRC, sink=SNK)\ndef clean(record, p):\n    return record\n",
        "flow.map: step 'clean' takes (record, p) but a map function must take " + PLAIN),
    "filter-extra-before-params": (
        "@flow.map(source=SRC, sink=SNK, kind='filter')\ndef keep(record, extra, *, params):\n"
        "    return True\n",
        "flow.map: step 'keep' takes (record, extra, *, params) but a filter function must take "
        "fn(record)" + ENDS.format("record")),
    "map-batches-two-extras": (
        "@flow.map(source=SRC, sink=SNK, kind='map_batches')\ndef many(batch, a, b):\n    return batch\n",
        "flow.map: step 'many' takes (batch, a, b) but a map_batches function must take "
        "fn(records)" + ENDS.format("records")),
    "model-one-argument": (
        "@flow.map(source=SRC, sink=SNK, model=Same())\ndef infer(batch):\n    return batch\n",
        "flow.map: step 'infer' takes (batch) but an inference function (model=) must take " + MODEL),
    "model-four-arguments": (
        "@flow.map(source=SRC, sink=SNK, model=Same())\ndef infer(batch, model, params, more):\n"
        "    return batch\n",
        "flow.map: step 'infer' takes (batch, model, params, more) but an inference function (model=) "
        "must take " + MODEL),
}

# Functions that fit: each runs to success, every record in the output.
ACCEPTED: dict[str, str] = {
    "optional-params": "@flow.map(source=SRC, sink=SNK)\ndef clean(record, params=None):\n"
                       "    assert params is not None\n    return record\n",
    "map-with-params": "@flow.map(source=SRC, sink=SNK)\ndef clean(record, params):\n    return record\n",
    "map-keyword-only-params": "@flow.map(source=SRC, sink=SNK)\ndef clean(record, *, params):\n"
                               "    return record\n",
    "filter-with-params": "@flow.map(source=SRC, sink=SNK, kind='filter')\ndef keep(record, params):\n"
                          "    return True\n",
    "flat-map-with-params": "@flow.map(source=SRC, sink=SNK, kind='flat_map')\n"
                            "def split(record, params):\n    return [record]\n",
    "map-batches-with-params": "@flow.map(source=SRC, sink=SNK, kind='map_batches')\n"
                               "def many(batch, params):\n    return batch\n",
    "record-named-params": "@flow.map(source=SRC, sink=SNK)\ndef clean(params):\n    return params\n",
    "star-args": "@flow.map(source=SRC, sink=SNK, kind='map_batches')\ndef many(*batches):\n"
                 "    return batches[0]\n",
    "builtin": "flow.map(source=SRC, sink=SNK)(dict)\n",  # inspect cannot read dict's signature
    "model": "@flow.map(source=SRC, sink=SNK, model=Same())\ndef infer(batch, model, params):\n"
             "    return model(batch)\n",
    "model-without-params": "@flow.map(source=SRC, sink=SNK, model=Same())\ndef infer(batch, model):\n"
                            "    return batch\n",
    "model-keyword-only-params": "@flow.map(source=SRC, sink=SNK, model=Same())\n"
                                 "def infer(batch, model, *, params):\n    return batch\n",
}


def run(tmp_path: Path, body: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    flow = tmp_path / "sig.py"
    flow.write_text(HEAD + body)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"k": k}) + "\n" for k in range(512)))
    home = tmp_path / "home"
    proc = subprocess.run(
        [sys.executable, "-m", "segue", "--home", str(home), "run", str(flow), "--run-id", "r",
         "-p", f"input={inp}", "-p", f"out={tmp_path / 'out'}"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120)
    return proc, home


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_map_function_with_the_wrong_signature_is_refused_at_load(
        tmp_path: Path, _test_pool: Path, name: str) -> None:
    body, line = REFUSED[name]
    proc, home = run(tmp_path, body)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"segue: {line}\n", proc.stderr
    assert not home.exists(), "a refused flow must not create the home (no run)"
    assert not (tmp_path / "out").exists(), "nor the output directory (no dead letters, no owner)"


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_a_map_function_that_fits_runs(tmp_path: Path, _test_pool: Path, name: str) -> None:
    proc, _ = run(tmp_path, ACCEPTED[name])
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for p in sorted((tmp_path / "out").glob("part-*")) for line in p.read_text().splitlines()]
    assert sorted(r["k"] for r in out) == list(range(512))
