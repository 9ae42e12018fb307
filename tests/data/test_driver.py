"""run_map end to end in-process: exactly once under injected crashes and pauses, per sink."""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from pathlib import Path

import pytest
from fakectx import Crash, FakeRun, write_jsonl
from sinkkit import SINK_KINDS, SinkKit, records, transform

from segue.data import (
    DeadLetterThresholdError,
    InputChangedError,
    JsonlSink,
    JsonlSource,
    SequenceSource,
    run_map,
)
from segue.errors import FencedError
from segue.run.context import Park


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))


def _source(tmp_path: Path, n: int, files: int = 3) -> JsonlSource:
    recs = records(n)
    for f in range(files):
        write_jsonl(tmp_path / f"in-{f}.jsonl", recs[f::files])
    return JsonlSource(str(tmp_path / "in-*.jsonl"), shard_bytes=700)


def _faulty_run(kit: SinkKit, source, seed: int, fn=transform, kind: str = "map") -> tuple[FakeRun, int]:
    rng = random.Random(seed)
    run = FakeRun()
    faults = 0
    for _ in range(500):
        mode = rng.choice(["before", "after", "pause", "fn"] + ([None] if faults >= 6 else []))
        ctx = run.attempt(rng=rng, every=3, crash=mode if mode in ("before", "after") else None,
                          crash_after=rng.randint(0, 4), pause_after=rng.randint(0, 4) if mode == "pause" else None)

        def flaky(r, _mode=mode):
            if _mode == "fn" and rng.random() < 0.01:
                raise Crash()
            return fn(r)

        try:
            run_map(ctx, source, flaky, kit.make(), kind=kind)
            return run, faults
        except (Crash, Park):
            faults += 1
    raise AssertionError("never finished")


@pytest.mark.parametrize("sink_kind", SINK_KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_exactly_once_under_crashes_and_pauses(tmp_path: Path, sink_kind: str, seed: int) -> None:
    kit = SinkKit(sink_kind, tmp_path)
    run, faults = _faulty_run(kit, _source(tmp_path, 600), seed)
    got = kit.read()
    assert faults >= 3
    counts = Counter(r["k"] for r in got)
    assert sorted(counts) == list(range(600)) and set(counts.values()) == {1}
    assert sorted(got, key=lambda r: r["k"]) == [transform(r) for r in records(600)]
    if sink_kind in ("jsonl", "parquet"):
        assert os.listdir(tmp_path / "out" / ".segue-staging" / run.run_id / run.step) == ["FENCE"]


@pytest.mark.parametrize("kind", ["filter", "flat_map", "map_batches"])
def test_other_kinds_exactly_once(tmp_path: Path, kind: str) -> None:
    kit = SinkKit("jsonl", tmp_path)
    fn = {
        "filter": lambda r: r["k"] % 3 == 0,
        "flat_map": lambda r: [transform(r), {"k": -r["k"] - 1, "v": "neg"}],
        "map_batches": lambda rs: [transform(r) for r in rs],
    }[kind]
    _faulty_run(kit, _source(tmp_path, 300), 7, fn=fn, kind=kind)
    got = sorted(kit.read(), key=lambda r: r["k"])
    if kind == "filter":
        want = [r for r in records(300) if r["k"] % 3 == 0]
    elif kind == "flat_map":
        want = sorted([transform(r) for r in records(300)] + [{"k": -i - 1, "v": "neg"} for i in range(300)],
                      key=lambda r: r["k"])
    else:
        want = [transform(r) for r in records(300)]
    assert got == want


def test_map_batches_by_bytes(tmp_path: Path) -> None:
    sizes = []

    def fn(rs):
        sizes.append(len(rs))
        return rs

    run = FakeRun()
    run_map(run.attempt(), _source(tmp_path, 300, files=1), fn, JsonlSink(tmp_path / "out"),
            kind="map_batches", batch_bytes=600)
    assert sum(sizes) == 300 and max(sizes) < 150  # ~600 bytes of ~27-byte lines, whole read batches


def test_pause_publishes_what_it_committed(tmp_path: Path) -> None:
    kit = SinkKit("jsonl", tmp_path)
    run = FakeRun()
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=1), _source(tmp_path, 300), transform, kit.make())
    n_committed = run.state["stats"]["records_out"]
    assert 0 < n_committed < 300 and len(kit.read()) == n_committed


def test_zombie_checkpoint_is_rejected_and_publishes_nothing(tmp_path: Path) -> None:
    kit = SinkKit("jsonl", tmp_path)
    run = FakeRun()
    zombie = run.attempt()
    run.attempt()  # a newer attempt took over: epoch 2
    with pytest.raises(FencedError):
        run_map(zombie, _source(tmp_path, 100), transform, kit.make())
    assert kit.read() == [] and run.state is None


def test_stale_publish_after_takeover_is_rejected(tmp_path: Path) -> None:
    kit = SinkKit("jsonl", tmp_path)
    run = FakeRun()
    src = _source(tmp_path, 50)
    a = run.attempt(crash="after")  # commits its first checkpoint, then "hangs" (crash stands in)
    with pytest.raises(Crash):
        run_map(a, src, transform, kit.make())
    from segue.data import Scope

    newer = run.attempt()
    run_map(newer, src, transform, kit.make())
    zombie_sink = JsonlSink(tmp_path / "out")
    zombie_sink._scope = Scope(run.run_id, run.step, a.epoch)  # as the zombie process holds it
    zombie_sink._pending = [{"staged": "x", "final": "y", "records": 1}]
    zombie_sink._staged = 1  # its last stage() covered that part
    os.makedirs(zombie_sink.staging, exist_ok=True)
    with pytest.raises(FencedError, match=r"^publish from epoch 1 rejected: epoch 2 owns "):
        zombie_sink.publish()
    assert sorted(r["k"] for r in kit.read()) == list(range(50))


def test_dead_letter_and_threshold(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    lines = [json.dumps({"k": i, "v": "x"}) for i in range(200)]
    lines[5] = "{not json"
    path.write_text("\n".join(lines) + "\n")

    def fn(r):
        if r["k"] % 50 == 7:
            raise ValueError(f"bad {r['k']}")
        return r

    run = FakeRun()
    dead = JsonlSink(tmp_path / "dead", prefix="dead-")
    out = run_map(run.attempt(), JsonlSource(str(path)), fn, JsonlSink(tmp_path / "out"), dead_letter=dead,
                  max_failures=10)
    assert out["failures"] == 5 and out["records_out"] == 195
    dl = [json.loads(x) for p in sorted((tmp_path / "dead").glob("dead-part-*")) for x in p.read_text().splitlines()]
    assert {d.get("raw") for d in dl} >= {"{not json"}
    assert sorted(d["ordinal"] for d in dl) == [5, 7, 57, 107, 157]
    assert all(d["error"] and "batch_start" in d for d in dl)

    run2 = FakeRun("run2")
    with pytest.raises(DeadLetterThresholdError,
                       match=r"^step 'step1': 5 of 200 records failed \(more than max_failures=2; last error: ValueError: bad 157\); they are in .*; fix the function or raise the limit, then resume$"):
        run_map(run2.attempt(), JsonlSource(str(path)), fn, JsonlSink(tmp_path / "out2"), max_failures=2)
    with pytest.raises(DeadLetterThresholdError, match=r"rate 0\.025 above max_failure_rate=0\.01"):
        run_map(FakeRun("run3").attempt(), JsonlSource(str(path)), fn, JsonlSink(tmp_path / "out3"),
                max_failure_rate=0.01, min_records_for_rate=100)


def test_input_change_policies(tmp_path: Path) -> None:
    src = _source(tmp_path, 90)
    run = FakeRun()
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=0), src, transform, JsonlSink(tmp_path / "out"))
    write_jsonl(tmp_path / "in-9.jsonl", [{"k": 1000, "v": "new"}])
    with open(tmp_path / "in-0.jsonl", "a") as f:
        f.write(json.dumps({"k": 2000, "v": "appended"}) + "\n")
    with pytest.raises(InputChangedError, match=r"^input of step 'step1' changed since the run began \(added .*in-9\.jsonl; modified .*in-0\.jsonl \(mtime .*, size \d+ -> \d+\)\)"):
        run_map(run.attempt(), src, transform, JsonlSink(tmp_path / "out"))
    out = run_map(run.attempt(), src, transform, JsonlSink(tmp_path / "out"), on_input_change="pin")
    assert out["records_out"] == 90  # appended bytes and the new file are ignored


def test_include_new_appends_files(tmp_path: Path) -> None:
    src = _source(tmp_path, 90)
    run = FakeRun()
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=0), src, transform, JsonlSink(tmp_path / "out"))
    write_jsonl(tmp_path / "in-9.jsonl", [{"k": 1000, "v": "new"}])
    out = run_map(run.attempt(), src, transform, JsonlSink(tmp_path / "out"), on_input_change="include-new")
    assert out["records_out"] == 91


def test_progress_position(tmp_path: Path) -> None:
    run = FakeRun()
    ctx = run.attempt()
    run_map(ctx, _source(tmp_path, 300), transform, JsonlSink(tmp_path / "out"))
    first, last = run.positions[0], run.positions[-1]
    assert first["unit"] == "bytes" and 0 < first["done"] < first["total"]
    assert last["done"] == last["total"] and last["records_in"] == 300 and last["eta_s"] == 0
    assert ctx.done == (last["total"], last["total"])


def test_completed_step_restores_to_the_same_summary(tmp_path: Path) -> None:
    src = SequenceSource(records(40), shards=2)
    run = FakeRun()
    first = run_map(run.attempt(), src, transform, JsonlSink(tmp_path / "out"))
    again = run_map(run.attempt(), src, transform, JsonlSink(tmp_path / "out"))
    assert again["records_out"] == first["records_out"] == 40
    assert len(list((tmp_path / "out").glob("part-*"))) == 2
