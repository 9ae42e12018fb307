"""A ``@flow.map`` function reads the run's params, with or without a model (issue 35, §6).

Through the real CLI: the flow ``mapparams`` has four map steps that tag every
record with the ``tag`` param: ``fn(record, *, params)`` in the step's process,
``fn(record, params)`` over two sub-worker processes, and an inference function
``fn(batch, model, *, params)`` (one process) and ``fn(batch, model, params)``
(two). Every record of every output carries the value given on the command
line. Before, a map function was passed no params: each record failed into the
dead-letter sink.
"""

from __future__ import annotations

import json
from pathlib import Path

from segue_helpers import Segue

FLOW = str(Path(__file__).parent / "flows" / "mapparams.py")
N = 300
SUB = {"two", "infer_two"}  # the workers=2 steps
STEPS = {"one": "cli-tag", "two": "cli-tag", "infer_one": "cli-tag+m", "infer_two": "cli-tag+m"}


def test_map_functions_read_the_runs_params(segue: Segue, tmp_path: Path) -> None:
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"k": k, "pad": "x" * 20}) + "\n" for k in range(N)))
    out = tmp_path / "out"
    proc = segue("run", FLOW, "--run-id", "p", "-p", f"input={inp}", "-p", f"out={out}",
                 "-p", "tag=cli-tag", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for step, tag in STEPS.items():
        parts = sorted((out / step).glob("part-*"))
        rows = [json.loads(line) for p in parts for line in p.read_text().splitlines()]
        assert sorted(r["k"] for r in rows) == list(range(N)), step
        assert {r["tag"] for r in rows} == {tag}, step
        # workers=2: every part was written by a sub-worker (its scope names it, "-wN-").
        assert parts and all(("-w" in p.name) == (step in SUB) for p in parts), [p.name for p in parts]
