"""The two-phase-commit contract, run against every sink (PostgreSQL included when available)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sinkkit import SINK_KINDS, SinkKit, records

from segue.data import Scope
from segue.errors import FencedError

ALL = SINK_KINDS + ["postgres", "postgres-upsert"]


@pytest.fixture(params=ALL)
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> SinkKit:
    url = request.getfixturevalue("pg_url") if request.param.startswith("postgres") else None
    return SinkKit(request.param, tmp_path, url)


def scope(epoch: int) -> Scope:
    return Scope("run1", "step1", epoch)


def _write(sink, recs, shard="00000"):
    sink.write(recs, shard, [f"{shard}:{r['k']}:0" for r in recs])


def test_nothing_visible_before_publish(kit: SinkKit) -> None:
    s = kit.make()
    s.open(scope(1), None)
    _write(s, records(10))
    s.stage()
    st = s.state()
    assert kit.read() == [] and len(st["pending"]) == 1
    s.publish()
    assert sorted(r["k"] for r in kit.read()) == list(range(10))
    s.publish()  # nothing pending: a no-op
    assert len(kit.read()) == 10
    s.close()


def test_roll_forward_is_idempotent(kit: SinkKit) -> None:
    s = kit.make()
    s.open(scope(1), None)
    _write(s, records(10)[:5], "00000")
    _write(s, records(10)[5:], "00001")
    s.stage()
    committed = s.state()  # the checkpoint commits this, then the process dies
    s.close()
    for epoch in (2, 3):  # recovery twice: published once
        r = kit.make()
        r.open(scope(epoch), committed)
        r.close()
    assert sorted(x["k"] for x in kit.read()) == list(range(10))


def test_roll_back_uncommitted(kit: SinkKit) -> None:
    s = kit.make()
    s.open(scope(1), None)
    _write(s, records(4))
    s.stage()
    committed = s.state()
    s.publish()
    _write(s, records(8)[4:])
    s.stage()  # staged but its checkpoint never commits
    s.close()
    r = kit.make()
    r.open(scope(2), {**committed, "pending": []})
    _write(r, records(8)[4:6])
    r.stage()
    r.publish()
    r.close()
    assert sorted(x["k"] for x in kit.read()) == list(range(6))


def test_zombie_publish_is_rejected(kit: SinkKit) -> None:
    zombie = kit.make()
    zombie.open(scope(1), None)
    _write(zombie, records(5))
    zombie.stage()
    committed = zombie.state()
    newer = kit.make()
    newer.open(scope(2), committed)  # takes over and rolls the commit forward
    with pytest.raises(FencedError, match=r"epoch 1 rejected: epoch 2 owns"):
        zombie.publish()
    newer.close()
    zombie.close()
    assert sorted(x["k"] for x in kit.read()) == list(range(5))


def test_stale_epoch_cannot_open(kit: SinkKit) -> None:
    a, b = kit.make(), kit.make()
    a.open(scope(3), None)
    with pytest.raises(FencedError):
        b.open(scope(2), None)
    a.close()
    b.close()


def test_sequential_attempts_and_steps_do_not_collide(kit: SinkKit) -> None:
    s = kit.make()
    s.open(scope(1), None)
    for i in range(3):
        _write(s, records(30)[i * 10:(i + 1) * 10], f"{i:05d}")
        s.stage()
        s.publish()
    s.finish()
    s.close()
    assert sorted(x["k"] for x in kit.read()) == list(range(30))


@pytest.fixture(params=["jsonl", "parquet"])
def worker_kit(request: pytest.FixtureRequest, tmp_path: Path) -> SinkKit:
    """The sinks a parallel step's sub-workers write, which go on writing while a checkpoint commits."""
    if request.param == "parquet":
        pytest.importorskip("pyarrow", reason="pyarrow is not installed; pip install pyarrow")
    return SinkKit(request.param, tmp_path)


def _read_on_past_the_cut(kit: SinkKit) -> tuple[Any, dict[str, Any]]:
    """A sub-worker's sink: 10 records staged (the state a checkpoint records), then 20 more
    written while that checkpoint commits; returns (sink, the staged state)."""
    s = kit.make()
    s.open(Scope("run1", "step1", 1, worker=0), None)
    recs = records(30)
    _write(s, recs[:10], "00000")
    s.stage()
    committed = s.state()
    _write(s, recs[10:20], "00001")
    _write(s, recs[20:], "00002")  # a new shard: the part of 00001 is closed, not staged
    return s, committed


def test_publish_covers_what_stage_staged_and_no_later_part(worker_kit: SinkKit) -> None:
    s, committed = _read_on_past_the_cut(worker_kit)
    s.publish()  # the checkpoint committed
    assert sorted(r["k"] for r in worker_kit.read()) == list(range(10))
    assert [p["records"] for p in committed["pending"]] == [10]
    s.stage()
    assert len(s.state()["pending"]) == 2  # what came after the cut, for the next checkpoint
    s.publish()
    assert sorted(r["k"] for r in worker_kit.read()) == list(range(30))
    s.close()


def test_output_written_past_the_cut_is_dropped_on_recovery(worker_kit: SinkKit) -> None:
    s, committed = _read_on_past_the_cut(worker_kit)
    s.close()  # killed after the commit, before the publish: the later parts are not covered
    r = worker_kit.make()
    r.open(Scope("run1", "step1", 2, worker=0), committed)
    assert sorted(x["k"] for x in worker_kit.read()) == list(range(10))
    assert not [p for p in Path(r.staging).iterdir() if p.name != "FENCE"]  # no leftover part
    r.close()
