"""GangSampler and GangReader: one global position, any number of ranks, every record once.

A run is simulated as it happens in a gang step: all ranks walk their reader in
lockstep for some global batches, the position (the same on every rank) is
"checkpointed", and new readers, for another number of ranks, go on from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from segue.data import GangReader, GangSampler, JsonlSource, SequenceSource
from segue.errors import PositionError, UsageError


@dataclass
class Ctx:
    rank: int
    world_size: int


def walk(make: Any, plan: list[tuple[int, int]], position: Any = None) -> tuple[list[list[Any]], Any]:
    """For each (ranks, global batches) of ``plan``: readers of that many ranks go on from the
    position for that many global batches (-1: to the end). Returns every global batch (all
    ranks' records, in rank order) up to the end of the data (a sampler's first epoch), and
    the position there."""
    seen: list[list[Any]] = []
    ended = False
    for ranks, batches in plan:
        if ended:
            break
        readers = [make(Ctx(r, ranks)) for r in range(ranks)]
        if position is not None:
            for rd in readers:
                rd.load(position)
        its = [iter(rd) for rd in readers]
        k = 0
        while batches < 0 or k < batches:
            got = [next(it, None) for it in its]
            if all(g is None for g in got):
                ended = True
                break
            assert None not in got, "the ranks disagree on where the data ends"
            seen.append([x for g in got for x in g])
            k += 1
        positions = [rd.position for rd in readers]
        assert all(p == positions[0] for p in positions), positions  # one global position
        position = positions[0]
    return seen, position


plans = st.lists(st.tuples(st.integers(1, 5), st.integers(0, 4)), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(n=st.integers(0, 60), batch=st.integers(1, 5), plan=plans, shuffle=st.booleans())
def test_sampler_every_record_once_whatever_the_ranks(n: int, batch: int, plan: list[tuple[int, int]],
                                                      shuffle: bool) -> None:
    def make(ctx: Ctx) -> GangSampler:
        return GangSampler(ctx, n, batch, shuffle=shuffle, seed=11)

    seen, pos = walk(make, [*plan, (plan[-1][0], -1)])
    records = [i for b in seen for i in b]
    assert sorted(records) == list(range(n))  # one epoch: none lost, none repeated
    assert records == make(Ctx(0, 1)).order(0)  # in the global order, whatever the ranks
    assert pos["epoch"] == 1 and pos["offset"] == 0


def test_sampler_orders_depend_on_seed_and_epoch_only() -> None:
    a, b = GangSampler(Ctx(0, 2), 20, 2, seed=3), GangSampler(Ctx(1, 5), 20, 4, seed=3)
    assert a.order(0) == b.order(0) != a.order(1)
    assert sorted(a.order(1)) == list(range(20))
    assert GangSampler(Ctx(0, 1), 5, 1, shuffle=False).order(7) == [0, 1, 2, 3, 4]


def test_sampler_goes_through_epochs_and_drop_last_skips_the_short_tail() -> None:
    s = GangSampler(Ctx(1, 2), 10, 2, shuffle=False, drop_last=True)
    assert list(s) == [[2, 3], [6, 7]]  # records 8, 9 would make a short global batch
    assert s.position["epoch"] == 1
    s2 = GangSampler(Ctx(1, 2), 10, 2, shuffle=False)
    assert list(s2) == [[2, 3], [6, 7], []]  # rank 1 gets nothing of the short tail


def test_sampler_refuses_a_position_of_another_order() -> None:
    pos = GangSampler(Ctx(0, 2), 10, 2, seed=1).position
    with pytest.raises(PositionError, match="give it the n, seed and shuffle it was saved with"):
        GangSampler(Ctx(0, 3), 10, 2, seed=2).load(pos)
    with pytest.raises(UsageError, match="batch_size must be an int >= 1"):
        GangSampler(Ctx(0, 1), 10, 0)
    with pytest.raises(UsageError, match="number of records n"):
        GangSampler(Ctx(0, 1), -1, 2)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 9), min_size=1, max_size=4), batch=st.integers(1, 4), plan=plans)
def test_reader_every_record_once_across_shards(sizes: list[int], batch: int,
                                                plan: list[tuple[int, int]]) -> None:
    data = list(range(sum(sizes)))
    source = SequenceSource(data, shards=len(sizes))

    def make(ctx: Ctx) -> GangReader:
        return GangReader(ctx, source, batch)

    seen, pos = walk(make, [*plan, (plan[-1][0], -1)])
    assert [x for b in seen for x in b] == data  # the stream's order, each record once
    assert pos["records"] == len(data)


def test_reader_on_jsonl_files_resumes_on_other_ranks_and_refuses_changed_input(tmp_path: Path) -> None:
    for f in range(3):
        (tmp_path / f"part-{f}.jsonl").write_text("".join(json.dumps({"id": f * 10 + i}) + "\n" for i in range(7)))
    source = JsonlSource(str(tmp_path / "*.jsonl"))

    def make(ctx: Ctx) -> GangReader:
        return GangReader(ctx, source, 2)

    seen, pos = walk(make, [(2, 3), (3, 1), (1, 2), (4, -1)])
    ids = [r["id"] for b in seen for r in b]
    assert ids == [f * 10 + i for f in range(3) for i in range(7)]
    (tmp_path / "part-9.jsonl").write_text('{"id": 99}\n')
    with pytest.raises(PositionError, match="input of this GangReader changed"):
        GangReader(Ctx(0, 2), JsonlSource(str(tmp_path / "*.jsonl")), 2).load(pos)
