"""A data step never ends SUCCEEDED short of its input.

Two guards: files added while paused are read after an ``include-new`` resume
with sub-workers (the coordinator's queue used to lose them), and every data
step checks at its end that it read all its input, so any such bug fails the
step loudly instead of committing "done".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakectx import FakeRun, read_jsonl_dir, write_jsonl

from segue.data import IncompleteInputError, JsonlSink, JsonlSource, SequenceSource, run_map
from segue.data.sources.base import Batch, Position
from segue.data.sources.memory import RangeShard
from segue.run.context import Park


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


def ident(r: dict[str, Any]) -> dict[str, Any]:
    return r


class ShortShard(RangeShard):
    """A shard with a bug: its last record never comes out (stands for any work a step loses)."""

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        return RangeShard(self.source, self.begin, self.end - 1, self.key).read(position, batch)


class ShortSource(SequenceSource):
    def shards(self, snapshot: dict[str, Any]) -> list[Any]:
        return [ShortShard(self, s.begin, s.end, s.key) for s in super().shards(snapshot)]

    def shard_from_json(self, data: dict[str, Any]) -> Any:
        s = super().shard_from_json(data)
        return ShortShard(self, s.begin, s.end, s.key)


@pytest.mark.parametrize("workers", [1, 2])
def test_files_added_while_paused_are_read_after_an_include_new_resume(tmp_path: Path, workers: int) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    write_jsonl(inp / "a.jsonl", [{"k": k} for k in range(2000)])
    src = JsonlSource(str(inp), shard_bytes=4000)
    run = FakeRun()
    with pytest.raises(Park):  # parks right after its first commit, as a pause does
        run_map(run.attempt(pause_after=0), src, ident, JsonlSink(tmp_path / "out"), workers=workers,
                read_batch=100, allow_pickle=True)
    assert not run.state["done"]
    write_jsonl(inp / "b2.jsonl", [{"k": k} for k in range(2000, 3000)])
    res = run_map(run.attempt(), src, ident, JsonlSink(tmp_path / "out"), workers=workers, read_batch=100,
                  allow_pickle=True, on_input_change="include-new")
    assert Counter(r["k"] for r in read_jsonl_dir(tmp_path / "out")) == Counter(range(3000))
    assert res["records_in"] == 3000
    assert res["bytes_in"] == sum(p.stat().st_size for p in inp.iterdir())


def as_row(r: int) -> dict[str, int]:
    return {"k": r}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_step_that_ends_short_of_its_input_fails_instead_of_committing_done(tmp_path: Path,
                                                                               workers: int) -> None:
    run = FakeRun()
    src = ShortSource(list(range(1000)), shards=4)
    with pytest.raises(IncompleteInputError, match=r"^step 'step1' reached its end having read 996 of the "
                                                   r"1,000 records its input holds; this is a bug in segue"):
        run_map(run.attempt(), src, as_row, JsonlSink(tmp_path / "out"), read_batch=100, workers=workers,
                allow_pickle=True)
    assert run.state is None or not run.state["done"]  # no checkpoint said "done"
