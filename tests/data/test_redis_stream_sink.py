"""RedisStreamSink against a real redis-server: staged with the checkpoint, published once, fenced."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import Crash, FakeRun

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RedisServer, redis_skip_reason, serve  # noqa: E402

from segue.data import Scope, SequenceSource, run_map  # noqa: E402
from segue.data.sinks.redis_stream import RedisStreamSink  # noqa: E402
from segue.errors import FencedError  # noqa: E402

N = 600
pytestmark = pytest.mark.usefixtures("own_home")  # dead letters: the test's own home


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from serve(RedisServer.start, redis_skip_reason(), tmp_path_factory.mktemp("redis"))


@pytest.fixture()
def out(redis_server: RedisServer, request: pytest.FixtureRequest) -> str:
    name = "out-" + request.node.name.replace("[", "-").replace("]", "")  # no glob characters
    r = redis_server.client()
    r.delete(name, *r.keys(f"segue:{{{name}}}:*"))
    return name


DATA = [{"k": k, "v": f"value-{k}"} for k in range(N)]


def fn(rec: dict[str, Any]) -> dict[str, Any]:
    return {"k": rec["k"], "v": rec["v"].upper()}


def published(r: Any, stream: str) -> list[dict[str, Any]]:
    return [json.loads(f["data"]) for _, f in r.xrange(stream)]


def check_once(r: Any, stream: str) -> None:
    got = published(r, stream)
    counts = Counter(x["k"] for x in got)
    assert sorted(counts) == list(range(N)) and set(counts.values()) == {1}, Counter(
        counts.values()
    )
    assert len({f["segue_id"] for _, f in r.xrange(stream)}) == N
    assert all(x["v"] == f"VALUE-{x['k']}" for x in got)


def sink(server: RedisServer, stream: str) -> RedisStreamSink:
    return RedisStreamSink(server.url, stream)


def test_publishes_each_output_once_with_the_checkpoint(
    redis_server: RedisServer, out: str
) -> None:
    r = redis_server.client()
    run = FakeRun()
    run_map(run.attempt(every=1), SequenceSource(DATA), fn, sink(redis_server, out), read_batch=50)
    check_once(r, out)
    assert r.hlen(f"segue:{{{out}}}:ledger") == N
    assert not r.keys(f"segue:{{{out}}}:staged:*")  # nothing left staged


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_crash_at_the_commit_neither_loses_nor_duplicates(
    redis_server: RedisServer, out: str, when: str
) -> None:
    r = redis_server.client()
    run = FakeRun()
    with pytest.raises(Crash):
        run_map(
            run.attempt(crash=when, crash_after=3),
            SequenceSource(DATA),
            fn,
            sink(redis_server, out),
            read_batch=50,
        )
    # Only what committed checkpoints covered and were published: 150 (the 4th part is staged).
    assert len(published(r, out)) == 150
    assert len(r.keys(f"segue:{{{out}}}:staged:*")) == 1
    s = sink(redis_server, out)
    run_map(run.attempt(), SequenceSource(DATA), fn, s, read_batch=50)
    check_once(r, out)
    # after: the next attempt rolled the committed part forward; before: it deleted the leftover.
    assert s.sent == (N - 150) and s.skipped == 0
    assert not r.keys(f"segue:{{{out}}}:staged:*")


def test_a_part_published_again_is_skipped_by_the_ledger(
    redis_server: RedisServer, out: str
) -> None:
    r = redis_server.client()
    first = sink(redis_server, out)
    first.open(Scope("run1", "step1", 1), None)
    first.write([{"k": 1}, {"k": 2}], "00000", ["00000:0:0", "00000:1:0"])
    first.stage()
    state = first.state()
    first.publish()
    # A restore from an older checkpoint produces the same outputs again (same keys).
    again = sink(redis_server, out)
    again.open(Scope("run1", "step1", 2), {"next_part": 0, "pending": []})
    again.write([{"k": 1}, {"k": 2}, {"k": 3}], "00000", ["00000:0:0", "00000:1:0", "00000:2:0"])
    again.stage()
    again.publish()
    assert [x["k"] for x in published(r, out)] == [1, 2, 3]
    assert (again.sent, again.skipped) == (1, 2)
    # Rolling the first part forward once more (a crash after its script) adds nothing.
    third = sink(redis_server, out)
    third.open(Scope("run1", "step1", 3), state)
    assert third.sent == 0 and len(published(r, out)) == 3


def test_a_zombie_attempt_is_fenced(redis_server: RedisServer, out: str) -> None:
    r = redis_server.client()
    zombie = sink(redis_server, out)
    zombie.open(Scope("run1", "step1", 1), None)
    zombie.write([{"k": 1}], "00000", ["00000:0:0"])
    zombie.stage()
    sink(redis_server, out).open(Scope("run1", "step1", 2), None)  # the retry takes over
    with pytest.raises(
        FencedError, match=r"^publish from epoch 1 rejected: epoch 2 owns run1/step1/ of stream "
    ):
        zombie.publish()
    zombie.write([{"k": 2}], "00000", ["00000:1:0"])
    with pytest.raises(FencedError):
        zombie.stage()
    assert published(r, out) == []
