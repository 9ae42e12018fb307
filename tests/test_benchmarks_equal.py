"""The benchmarks' output checks never pass on nothing (issue 35 §1).

A benchmark prints a ratio only when each side wrote exactly the expected
output; two empty outputs are equal, but a comparison of no record proves
nothing, so it is refused like a mismatch. Real files, the benchmarks' own
readers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # `benchmarks` is a package of the repository, not of segue

from benchmarks import inference, pipeline  # noqa: E402


def jsonl(path: Path, recs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_a_digest_of_no_record_never_matches(tmp_path: Path) -> None:
    empty = pipeline.digest([jsonl(tmp_path / "a.jsonl", [])])
    assert empty[0] == 0
    assert (
        pipeline.mismatch(empty, empty)
        == "the expected output has no record, so nothing would be compared"
    )
    assert pipeline.mismatch(empty, pipeline.digest([])) is not None  # no file at all either


def test_a_digest_matches_only_the_same_records(tmp_path: Path) -> None:
    recs = [{"k": i, "v": f"v{i}"} for i in range(3)]
    want = pipeline.digest([jsonl(tmp_path / "a.jsonl", recs)])
    # Key order and record order do not matter; a lost or an extra record does.
    same = pipeline.digest(
        [jsonl(tmp_path / "b.jsonl", [{"v": r["v"], "k": r["k"]} for r in reversed(recs)])]
    )
    assert pipeline.mismatch(same, want) is None
    lost = pipeline.digest([jsonl(tmp_path / "c.jsonl", recs[:2])])
    assert pipeline.mismatch(lost, want).startswith("wrote 2 records with hash ")
    assert pipeline.mismatch(pipeline.digest([]), want).startswith("wrote 0 records with hash ")


def _parquet(path: Path, keys: list[int]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.mkdir()
    table = pa.table(
        {
            "k": pa.array(keys, pa.int64()),
            "e": pa.array([[float(k), 1.0] for k in keys], pa.list_(pa.float32())),
        }
    )
    pq.write_table(table, path / "part-0.parquet")
    return path


def test_the_inference_check_refuses_an_empty_reference(tmp_path: Path) -> None:
    empty = _parquet(tmp_path / "empty", [])
    ref = inference.read_output(empty)
    with pytest.raises(
        SystemExit,
        match=r"^side: the reference holds no record, so nothing would be "
        r"compared: no ratio$",
    ):
        inference.check("side", empty, ref, 1e-6)


def test_the_inference_check_passes_the_same_records_and_fails_missing_ones(tmp_path: Path) -> None:
    ref = inference.read_output(_parquet(tmp_path / "ref", [2, 0, 1]))
    assert inference.check("side", _parquet(tmp_path / "same", [0, 1, 2]), ref, 1e-6) == 0.0
    with pytest.raises(
        SystemExit, match=r"^side: wrote 0 records \(0 distinct keys\); expected each of 3 "
    ):
        inference.check("side", _parquet(tmp_path / "none", []), ref, 1e-6)
