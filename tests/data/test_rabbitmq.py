"""RabbitMQSource against a real rabbitmq-server: acks follow commits, the ledger, poison, drain.

The attempts here run in-process (tests/data/fakectx.py: a ``Crash`` before or
after the commit; the source's connection closes with it, so the broker
requeues what was not acked, as it does for a killed worker). The SIGKILL
campaign, the broker restart and the submit-time refusals through the CLI are
in test_rabbitmq_kills.py. Queue counts come from a passive declare: once no
consumer is left, an unacked message would be ready again, so ``ready == 0``
with no consumer means nothing is ready and nothing is unacked.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import Crash, FakeRun, read_jsonl_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RabbitMQServer, rabbitmq_skip_reason, serve  # noqa: E402

from segue.data import JsonlSink, run_map  # noqa: E402
from segue.errors import DataError  # noqa: E402

pytestmark = pytest.mark.usefixtures("own_home")  # dead letters: the test's own home


@pytest.fixture(scope="module")
def mq(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from serve(RabbitMQServer.start, rabbitmq_skip_reason(), tmp_path_factory.mktemp("mq"))


@pytest.fixture()
def queue(mq: RabbitMQServer, request: pytest.FixtureRequest) -> str:
    name = "q-" + request.node.name.replace("[", "-").replace("]", "")
    mq.declare(name)
    return name


def produce(mq: RabbitMQServer, queue: str, n: int, first: int = 0) -> None:
    keys = range(first, first + n)
    mq.publish(queue, [json.dumps({"k": k, "v": f"value-{k}"}) for k in keys], [f"m{k}" for k in keys])


def fn(rec: dict[str, Any]) -> dict[str, Any]:
    return {"k": rec["k"], "v": rec["v"].upper()}


def source(mq: RabbitMQServer, queue: str, **kw: Any) -> Any:
    from segue.data.sources.rabbitmq import RabbitMQSource

    kw.setdefault("drain_after_empty_reads", 1)
    kw.setdefault("block_ms", 50)
    return RabbitMQSource(mq.url, queue, **kw)


def state(mq: RabbitMQServer, queue: str) -> tuple[int, int]:
    return mq.counts(queue)  # (ready, consumers)


def check_once(out: Path, n: int, first: int = 0) -> None:
    got = read_jsonl_dir(out)
    counts = Counter(r["k"] for r in got)
    want = set(range(first, first + n))
    assert set(counts) == want, f"lost {sorted(want - set(counts))[:10]}"
    assert set(counts.values()) == {1}, f"duplicated {[k for k, c in counts.items() if c > 1][:10]}"
    assert all(r["v"] == f"VALUE-{r['k']}" for r in got)


def test_reads_the_queue_and_acks_everything_after_commits(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    produce(mq, queue, 1000)
    run, src = FakeRun(), source(mq, queue, prefetch=100)
    out = run_map(run.attempt(), src, fn, JsonlSink(tmp_path / "out"), read_batch=64)
    assert out["records_in"] == 1000 and out["failures"] == 0
    check_once(tmp_path / "out", 1000)
    assert src.acked == 1000 and state(mq, queue) == (0, 0)
    # The position is bounded by the window (the prefetch) and the ledger, never by the input;
    # the last one names what the final commit covers, acked after it.
    pos = run.state["cursor"]["position"]
    assert 0 < len(pos["window"]) <= 100
    assert sorted(pos["ledger"] + pos["window"], key=lambda m: int(m[1:])) == [
        f"m{k}" for k in range(1000)
    ]


def test_a_crash_before_the_commit_redelivers_its_messages_and_they_are_redone(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    produce(mq, queue, 500)
    run = FakeRun()
    with pytest.raises(Crash):
        run_map(run.attempt(crash="before", crash_after=2), source(mq, queue), fn,
                JsonlSink(tmp_path / "out"), read_batch=50)
    # Two commits published what they covered: a read takes what has arrived, up to 50
    # (CI once saw 74, not 100: a batch cut short by messages still on their way).
    published = len(read_jsonl_dir(tmp_path / "out"))
    assert 0 < published <= 100 and published == run.state["cursor"]["position"]["records"]
    assert state(mq, queue) == (500 - published, 0)  # the third batch was read, never committed: back
    src = source(mq, queue)
    run_map(run.attempt(), src, fn, JsonlSink(tmp_path / "out"), read_batch=50)
    check_once(tmp_path / "out", 500)
    assert src.dropped == 0 and state(mq, queue) == (0, 0)


def test_a_crash_between_commit_and_ack_drops_the_redelivered_messages_by_the_ledger(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    produce(mq, queue, 300)
    run = FakeRun()
    with pytest.raises(Crash):  # committed the third batch, then died: not published, not acked
        run_map(run.attempt(crash="after", crash_after=2), source(mq, queue), fn,
                JsonlSink(tmp_path / "out"), read_batch=50)
    # A read takes what has arrived (up to 50): count from the last commit's position.
    pos = run.state["cursor"]["position"]
    covered, unacked = pos["records"], len(pos["window"])  # the window: committed, never acked
    assert 0 < unacked <= 50 < covered
    assert state(mq, queue) == (300 - covered + unacked, 0)  # the tags died with the channel: redelivered
    src = source(mq, queue)
    got: list[int] = []

    def spy(rec: dict[str, Any]) -> dict[str, Any]:
        got.append(rec["k"])
        return fn(rec)

    run_map(run.attempt(), src, spy, JsonlSink(tmp_path / "out"), read_batch=50)
    check_once(tmp_path / "out", 300)
    # The committed ones were published by the restore and dropped by the ledger.
    assert sorted(got) == list(range(covered, 300)), got[:10]
    assert src.dropped == unacked and src.acked == 300 - covered + unacked
    assert state(mq, queue) == (0, 0)


def test_a_crash_after_the_final_commit_acks_on_restore_without_reading(
    mq: RabbitMQServer, queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from segue.data.sources.rabbitmq import RabbitMQSource

    produce(mq, queue, 120)
    run = FakeRun()
    ack = RabbitMQSource.after_commit

    def die_before_the_last_ack(self: RabbitMQSource, position: Any) -> None:
        if run.state is not None and run.state["done"]:
            raise Crash()  # committed "done" and published; the ack never happened
        ack(self, position)

    monkeypatch.setattr(RabbitMQSource, "after_commit", die_before_the_last_ack)
    never = random.Random(0)  # checkpoint_due is (almost) never true: the final commit covers all
    with pytest.raises(Crash):
        run_map(run.attempt(rng=never, every=10**9), source(mq, queue), fn,
                JsonlSink(tmp_path / "out"), read_batch=50)
    monkeypatch.setattr(RabbitMQSource, "after_commit", ack)
    assert len(read_jsonl_dir(tmp_path / "out")) == 120
    ready, _ = state(mq, queue)
    assert ready == 120  # published, never acked: the tags died with the channel
    src = source(mq, queue)
    run_map(run.attempt(), src, lambda r: pytest.fail("a done step processed a record"),
            JsonlSink(tmp_path / "out"))
    check_once(tmp_path / "out", 120)
    assert src.acked == src.dropped == ready and state(mq, queue) == (0, 0)


def test_a_pause_parks_with_every_published_message_acked_and_new_ones_are_read_on_resume(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    from segue._park import Park

    produce(mq, queue, 400)
    run = FakeRun()
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=3), source(mq, queue, prefetch=40), fn,
                JsonlSink(tmp_path / "out"), read_batch=40)
    published = len(read_jsonl_dir(tmp_path / "out"))
    # Parked after the commits it made (a read takes what has arrived, up to 40), all acked.
    assert 0 < published <= 160 and published == run.state["cursor"]["position"]["records"]
    assert state(mq, queue) == (400 - published, 0)
    produce(mq, queue, 100, first=400)  # a producer goes on while the step is parked
    run_map(run.attempt(), source(mq, queue), fn, JsonlSink(tmp_path / "out"), read_batch=40)
    check_once(tmp_path / "out", 500)
    assert state(mq, queue) == (0, 0)


def test_a_full_prefetch_window_asks_for_a_commit_instead_of_waiting(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    produce(mq, queue, 200)
    run = FakeRun()
    never = random.Random(0)  # checkpoint_due is (almost) never true: only the window commits
    src = source(mq, queue, prefetch=16)
    run_map(run.attempt(rng=never, every=10**9), src, fn, JsonlSink(tmp_path / "out"), read_batch=8)
    check_once(tmp_path / "out", 200)
    assert run.commits >= 200 // 16 and state(mq, queue) == (0, 0)


@pytest.mark.parametrize("kind", ["quorum", "classic"])
def test_poison_and_bad_messages_go_to_the_dead_letter_file_and_are_acked(
    mq: RabbitMQServer, tmp_path: Path, kind: str
) -> None:
    queue = f"poison-{kind}"
    mq.declare(queue, kind)
    produce(mq, queue, 20)
    mq.publish(queue, ["{not json", json.dumps({"k": 99, "v": "x"}), b"\xff\xfe"],
               ["bad-json", None, "bad-utf8"])
    home = tmp_path / "home"
    run = FakeRun()

    def killer(rec: dict[str, Any]) -> dict[str, Any]:  # the first 5 kill every worker
        if rec["k"] < 5:
            raise Crash()
        return fn(rec)

    for attempt in range(4):
        with pytest.raises(Crash):
            run_map(run.attempt(), source(mq, queue, prefetch=5), killer,
                    JsonlSink(tmp_path / "out"), read_batch=5)
        if kind == "classic" and attempt:
            # A classic queue counts nothing: the redelivery count is committed by a
            # checkpoint of its own before the messages are processed.
            assert run.state["cursor"]["position"]["counts"] == {
                f"m{k}": attempt + 1 for k in range(5)
            }
    ctx = run.attempt()
    ctx.home = str(home)  # type: ignore[attr-defined]
    out = run_map(ctx, source(mq, queue, max_deliveries=4), fn, JsonlSink(tmp_path / "out"))
    assert out["failures"] == 8 and out["records_out"] == 15, out
    dead = read_jsonl_dir(home / "dead-letter" / "run1" / "step1", "dead-*.jsonl")
    errors = sorted(d["error"] for d in dead)
    assert sum("was delivered 5 times, more than max_deliveries=4" in e for e in errors) == 5, errors
    assert {json.loads(d["raw"])["id"] for d in dead if "delivered" in d["error"]} == {
        f"m{k}" for k in range(5)
    }
    assert sum(e.startswith("message bad-json is not valid JSON") for e in errors) == 1
    assert sum(e.startswith("message bad-utf8 is not UTF-8") for e in errors) == 1
    assert sum("has no message_id property; publish every message with one" in e for e in errors) == 1
    check_once(tmp_path / "out", 15, first=5)
    assert state(mq, queue) == (0, 0)


def test_the_id_may_come_from_a_header(mq: RabbitMQServer, queue: str, tmp_path: Path) -> None:
    import pika

    conn = mq.connection()
    ch = conn.channel()
    for k in range(10):
        props = pika.BasicProperties(delivery_mode=2, headers={"x-id": f"h{k}"})
        ch.basic_publish("", queue, json.dumps({"k": k, "v": f"value-{k}"}).encode(), props)
    conn.close()
    run = FakeRun()
    out = run_map(run.attempt(), source(mq, queue, id_header="x-id", id_key="mid"),
                  lambda r: r, JsonlSink(tmp_path / "out"))
    assert out["records_out"] == 10
    assert sorted(r["mid"] for r in read_jsonl_dir(tmp_path / "out")) == sorted(f"h{k}" for k in range(10))


def test_drain_after_max_messages_and_the_idle_clock(
    mq: RabbitMQServer, queue: str, tmp_path: Path
) -> None:
    produce(mq, queue, 100)
    src = source(mq, queue, max_messages=40, drain_after_empty_reads=None, prefetch=64)
    out = run_map(FakeRun().attempt(), src, fn, JsonlSink(tmp_path / "a"))
    assert out["records_in"] == 40 and state(mq, queue) == (60, 0)
    now = [0.0]

    def clock() -> float:  # each read advances the idle clock by 1 s
        now[0] += 1.0
        return now[0]

    src = source(mq, queue, drain_after_empty_reads=None, drain_idle_s=5.0, clock=clock)
    out = run_map(FakeRun("run2").attempt(), src, fn, JsonlSink(tmp_path / "b"))
    assert out["records_in"] == 60 and state(mq, queue) == (0, 0)
    check_once(tmp_path / "b", 60, first=40)


def test_bad_input_is_one_line(mq: RabbitMQServer, tmp_path: Path) -> None:
    from segue.data._amqp import BrokerUnreachable
    from segue.data.sources.rabbitmq import RabbitMQSource

    port = mq.port
    with pytest.raises(DataError, match=rf"^queue 'no-such-queue' does not exist at amqp://guest:\*\*\*@127\.0\.0\.1:{port}/%2F; "):
        source(mq, "no-such-queue").probe()
    with pytest.raises(DataError, match=rf"^the AMQP broker at amqp://guest:\*\*\*@127\.0\.0\.1:{port}/%2F refused the login; check the user and password$"):
        RabbitMQSource(mq.url.replace("guest@", "wrong@"), "q").probe()
    with pytest.raises(BrokerUnreachable, match=r"^cannot reach the AMQP broker at amqp://127\.0\.0\.1:1/ \(.*\); check the host and port$"):
        RabbitMQSource("amqp://127.0.0.1:1/", "q").probe()
    with pytest.raises(DataError, match=r"^queue 'no-such-queue' does not exist"):
        run_map(FakeRun().attempt(), source(mq, "no-such-queue"), fn, JsonlSink(tmp_path / "out"))
    with pytest.raises(ValueError, match=r"^RabbitMQSource is read by one process: use workers=1$"):
        run_map(FakeRun().attempt(), source(mq, "q"), fn, JsonlSink(tmp_path / "out"), workers=2)


def test_lag_counts_what_it_holds_and_dates_it_by_the_timestamp_property(
    mq: RabbitMQServer, queue: str
) -> None:
    """The lag in-process: unacked is the attempt's own count, undelivered the passive
    declare's, the oldest age from the held messages' ``timestamp``; a message's
    ``expiration`` is what the queue keeps; an ack lets go of what it covers."""
    import time
    from types import SimpleNamespace

    import pika

    now = time.time()
    conn = mq.connection()
    ch = conn.channel()
    ch.confirm_delivery()
    for k in range(20):
        ch.basic_publish("", queue, json.dumps({"k": k, "v": "x"}).encode(), pika.BasicProperties(
            delivery_mode=2, message_id=f"m{k}", timestamp=int(now) - 100 + k,
            expiration="60000"))
    conn.close()
    src = source(mq, queue, prefetch=10, drain_after_empty_reads=None, drain_idle_s=None)
    src.attach(SimpleNamespace(run_id="r", step="s", worker=0, epoch=1))
    try:
        batches = src.read_from(src.start_position(), 10)
        first = next(batches)
        while not first.records:
            first = next(batches)
        lag = src.lag()
        assert 1 <= lag["pending"] <= 10 and lag["pending"] + lag["undelivered"] == 20, lag
        assert 99 <= lag["oldest_age_s"] <= 100 + (time.time() - now) + 1, lag
        assert lag["keeps_s"] == 60.0 and "expiration property" in lag["keeps"], lag
        src.after_commit(first.position)
        after = src.lag()
        assert after["pending"] == lag["pending"] - len(first.records), (lag, after)
        if after["pending"]:  # what is still held dates the oldest age
            assert after["oldest_age_s"] < lag["oldest_age_s"], (lag, after)
        else:
            assert after["oldest_age_s"] is None, after
    finally:
        src.close()
