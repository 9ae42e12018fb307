"""RedisStreamSource against a real redis-server: acks follow commits, recovery, poison, drain.

The attempts here run in-process (tests/data/fakectx.py: a ``Crash`` before or
after the commit); the SIGKILL and broker-restart proofs through the CLI are in
test_redis_stream_kills.py.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import Crash, FakeRun, read_jsonl_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RedisServer, redis_skip_reason, serve  # noqa: E402

from segue.data import JsonlSink, run_map  # noqa: E402
from segue.data.sources.redis_stream import RedisStreamSource  # noqa: E402
from segue.errors import DataError  # noqa: E402

pytestmark = pytest.mark.usefixtures("own_home")  # dead letters: the test's own home


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from serve(RedisServer.start, redis_skip_reason(), tmp_path_factory.mktemp("redis"))


@pytest.fixture()
def stream(redis_server: RedisServer, request: pytest.FixtureRequest) -> str:
    name = "s-" + request.node.name.replace("[", "-").replace("]", "")
    redis_server.client().delete(name)
    return name


def produce(r: Any, stream: str, n: int, first: int = 0) -> list[str]:
    pipe = r.pipeline()
    for k in range(first, first + n):
        pipe.xadd(stream, {"data": json.dumps({"k": k, "v": f"value-{k}"})})
    return list(pipe.execute())


def fn(rec: dict[str, Any]) -> dict[str, Any]:
    return {"k": rec["k"], "v": rec["v"].upper()}


def source(server: RedisServer, stream: str, **kw: Any) -> RedisStreamSource:
    kw.setdefault("drain_after_empty_reads", 1)
    kw.setdefault("block_ms", 0)
    return RedisStreamSource(server.url, stream, **kw)


def pending(r: Any, stream: str, group: str = "segue-step1") -> int:
    return int(r.xpending(stream, group)["pending"])


def group_info(r: Any, stream: str, group: str = "segue-step1") -> dict[str, Any]:
    return next(g for g in r.xinfo_groups(stream) if g["name"] == group)


def check_once(out: Path, n: int) -> None:
    got = read_jsonl_dir(out)
    counts = Counter(r["k"] for r in got)
    assert sorted(counts) == list(range(n)), f"lost {sorted(set(range(n)) - set(counts))[:10]}"
    assert set(counts.values()) == {1}, f"duplicated {[k for k, c in counts.items() if c > 1][:10]}"
    assert all(r["v"] == f"VALUE-{r['k']}" for r in got)


def test_reads_the_stream_and_acks_everything_after_commits(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    produce(r, stream, 1000)
    run = FakeRun()
    out = run_map(
        run.attempt(), source(redis_server, stream), fn, JsonlSink(tmp_path / "out"), read_batch=64
    )
    assert out["records_in"] == 1000 and out["failures"] == 0
    check_once(tmp_path / "out", 1000)
    assert pending(r, stream) == 0
    info = group_info(r, stream)
    assert info["entries-read"] == 1000 and info["lag"] == 0
    # The checkpoint's position is O(1): a range of new ids, never the ids themselves.
    assert all(len(json.dumps(p)) < 2000 for p in run.positions)
    assert run.state["cursor"]["position"]["ids"] == []


def test_a_crash_before_the_commit_leaves_its_messages_pending_then_they_are_redone(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    produce(r, stream, 500)
    run = FakeRun()
    with pytest.raises(Crash):
        run_map(
            run.attempt(crash="before", crash_after=2),
            source(redis_server, stream),
            fn,
            JsonlSink(tmp_path / "out"),
            read_batch=50,
        )
    # Two batches were committed and acked; the third was read, never committed: still pending.
    assert pending(r, stream) == 50
    assert len(read_jsonl_dir(tmp_path / "out")) == 100
    run_map(
        run.attempt(), source(redis_server, stream), fn, JsonlSink(tmp_path / "out"), read_batch=50
    )
    check_once(tmp_path / "out", 500)
    assert pending(r, stream) == 0


def test_a_crash_between_commit_and_ack_acks_on_restore_without_reprocessing(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    produce(r, stream, 300)
    run = FakeRun()
    with pytest.raises(Crash):  # committed the third batch, then died: not published, not acked
        run_map(
            run.attempt(crash="after", crash_after=2),
            source(redis_server, stream),
            fn,
            JsonlSink(tmp_path / "out"),
            read_batch=50,
        )
    assert pending(r, stream) == 50
    src = source(redis_server, stream)
    got: list[Any] = []

    def spy(rec: dict[str, Any]) -> dict[str, Any]:
        got.append(rec["k"])
        return fn(rec)

    run_map(run.attempt(), src, spy, JsonlSink(tmp_path / "out"), read_batch=50)
    check_once(tmp_path / "out", 300)
    assert pending(r, stream) == 0
    # The 50 committed ones were acked by the restore, not processed again.
    assert sorted(got) == list(range(150, 300)), got[:10]
    assert src.acked == 150 + 50


def test_a_pause_parks_with_every_published_message_acked(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    from segue._park import Park

    r = redis_server.client()
    produce(r, stream, 400)
    run = FakeRun()
    with pytest.raises(Park):
        run_map(
            run.attempt(pause_after=3),
            source(redis_server, stream),
            fn,
            JsonlSink(tmp_path / "out"),
            read_batch=40,
        )
    published = len(read_jsonl_dir(tmp_path / "out"))
    info = group_info(r, stream)
    assert info["pending"] == 0 and info["entries-read"] == published == 160
    produce(r, stream, 100, first=400)  # a producer goes on while the step is parked
    run_map(
        run.attempt(), source(redis_server, stream), fn, JsonlSink(tmp_path / "out"), read_batch=40
    )
    check_once(tmp_path / "out", 500)
    assert pending(r, stream) == 0


def test_poison_and_bad_messages_go_to_the_dead_letter_file_and_are_acked(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    ids = produce(r, stream, 20)
    r.xadd(stream, {"data": "{not json"})
    r.xadd(stream, {"other": "x"})
    # A crashed attempt of this very step (same consumer name) took the first 5 four times.
    r.xgroup_create(stream, "segue-step1", id="0")
    me = "run1:step1:w0"
    r.xreadgroup("segue-step1", me, {stream: ">"}, count=5)
    for _ in range(3):
        r.xreadgroup("segue-step1", me, {stream: "0"}, count=5)
    home = tmp_path / "home"
    ctx = FakeRun().attempt()
    ctx.home = str(home)  # type: ignore[attr-defined]
    out = run_map(
        ctx, source(redis_server, stream, max_deliveries=4), fn, JsonlSink(tmp_path / "out")
    )
    assert out["failures"] == 7 and out["records_out"] == 15
    dead = read_jsonl_dir(home / "dead-letter" / "run1" / "step1", "dead-*.jsonl")
    errors = sorted(d["error"] for d in dead)
    assert sum("was delivered 5 times, more than max_deliveries=4" in e for e in errors) == 5, (
        errors
    )
    assert sum("is not valid JSON" in e for e in errors) == 1
    assert sum("has no field 'data'" in e for e in errors) == 1
    assert {json.loads(d["raw"])["id"] for d in dead if "delivered" in d["error"]} == set(ids[:5])
    assert pending(r, stream) == 0


def test_entries_of_a_dead_consumer_are_claimed(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    produce(r, stream, 100)
    r.xgroup_create(stream, "segue-step1", id="0")
    r.xreadgroup("segue-step1", "an-old-run:step1:w0", {stream: ">"}, count=30)  # then it died
    run_map(
        FakeRun().attempt(),
        source(redis_server, stream, claim_idle_ms=0),
        fn,
        JsonlSink(tmp_path / "out"),
    )
    check_once(tmp_path / "out", 100)
    assert pending(r, stream) == 0


def test_a_trimmed_pending_message_is_dead_lettered(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    ids = produce(r, stream, 10)
    r.xgroup_create(stream, "segue-step1", id="0")
    r.xreadgroup("segue-step1", "run1:step1:w0", {stream: ">"}, count=3)
    r.xdel(stream, ids[1])
    ctx = FakeRun().attempt()
    ctx.home = str(tmp_path / "home")  # type: ignore[attr-defined]
    out = run_map(ctx, source(redis_server, stream), fn, JsonlSink(tmp_path / "out"))
    assert out["failures"] == 1 and out["records_out"] == 9
    dead = read_jsonl_dir(tmp_path / "home" / "dead-letter" / "run1" / "step1", "dead-*.jsonl")
    assert [d["error"] for d in dead] == [
        f"message {ids[1]} was trimmed from stream {stream!r} before it was processed"
    ]
    assert pending(r, stream) == 0


def test_drain_after_max_messages_and_the_idle_clock(
    redis_server: RedisServer, stream: str, tmp_path: Path
) -> None:
    r = redis_server.client()
    produce(r, stream, 100)
    out = run_map(
        FakeRun().attempt(),
        source(redis_server, stream, max_messages=40, drain_after_empty_reads=None),
        fn,
        JsonlSink(tmp_path / "a"),
    )
    assert out["records_in"] == 40 and pending(r, stream) == 0
    # The idle period is measured on the source's clock: here each read advances it 1 s.
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    src = source(redis_server, stream, drain_after_empty_reads=None, drain_idle_s=5.0, clock=clock)
    out = run_map(FakeRun("run2").attempt(), src, fn, JsonlSink(tmp_path / "b"))
    assert out["records_in"] == 60 and pending(r, stream) == 0


def test_a_missing_stream_is_one_line_and_workers_are_refused(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    src = source(redis_server, "no-such-stream")
    with pytest.raises(
        DataError, match=r"^stream 'no-such-stream' does not exist at redis://127\.0\.0\.1:\d+/0; "
    ):
        run_map(FakeRun().attempt(), src, fn, JsonlSink(tmp_path / "out"))
    with pytest.raises(
        ValueError, match=r"^RedisStreamSource is read by one process: use workers=1$"
    ):
        run_map(FakeRun().attempt(), src, fn, JsonlSink(tmp_path / "out"), workers=2)
