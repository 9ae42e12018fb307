"""PubSubSource against gcloud's real Pub/Sub emulator: acks follow commits, deadlines are
extended through a long batch, the ledger, poison, drain and continuous reads, retention.

The attempts here run in-process (tests/data/fakectx.py: a ``Crash`` before or
after the commit; the source's ``close`` runs with it and gives back what no
commit covers, as the ack deadline does for a killed worker). The SIGKILL
campaign, the pause with a producer going on and the submit-time refusals
through the CLI are in test_pubsub_kills.py. "Nothing unacked" is checked by
pulling once every ack deadline has passed: an unacked message would be
delivered again.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakectx import Crash, FakeRun, read_jsonl_dir

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pubsubkit import PubSubEmulator, pubsub_skip_reason  # noqa: E402

from segue.data import JsonlSink, run_map  # noqa: E402

DEADLINE = 10  # the subscriptions' ack deadline (Pub/Sub's minimum)


@pytest.fixture(scope="module")
def ps(tmp_path_factory: pytest.TempPathFactory) -> Any:
    why = pubsub_skip_reason()
    if why:
        pytest.skip(why)
    emu = PubSubEmulator.start(tmp_path_factory.mktemp("pubsub"))
    try:
        yield emu
    finally:
        emu.stop()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGUE_HOME", str(tmp_path / "home"))  # dead letters: the test's own home


def name(request: pytest.FixtureRequest) -> str:
    return "t-" + request.node.name.replace("[", "-").replace("]", "").replace("_", "-")[-60:]


def produce(ps: PubSubEmulator, topic: str, n: int, first: int = 0) -> None:
    ps.publish(topic, [json.dumps({"k": k, "v": f"value-{k}"}) for k in range(first, first + n)])


def fn(rec: dict[str, Any]) -> dict[str, Any]:
    return {"k": rec["k"], "v": rec["v"].upper()}


def source(ps: PubSubEmulator, sub: str, **kw: Any) -> Any:
    from segue.data.sources.pubsub import PubSubSource

    kw.setdefault("drain_after_empty_reads", 1)
    kw.setdefault("block_ms", 1000)
    return PubSubSource(sub, emulator_host=ps.host, **kw)


def check_once(out: Path, n: int) -> None:
    got = read_jsonl_dir(out)
    counts = Counter(r["k"] for r in got)
    assert set(counts) == set(range(n)), f"lost {sorted(set(range(n)) - set(counts))[:10]}"
    assert max(counts.values()) == 1, [k for k, c in counts.items() if c > 1][:10]
    assert sorted((r["k"], r["v"]) for r in got) == [(k, f"VALUE-{k}") for k in range(n)]


def test_a_map_step_publishes_every_message_once_and_acks_them_after_the_commit(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic = name(request)
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE)
    produce(ps, topic, 600)
    run = FakeRun()
    src = source(ps, sub, max_outstanding=100)
    out = run_map(run.attempt(), src, fn, JsonlSink(tmp_path / "out"), read_batch=64)
    assert out["records_in"] == 600 and out["failures"] == 0
    check_once(tmp_path / "out", 600)
    assert src.acked == 600 and src.dropped == 0
    # O(1): the window is bounded by max_outstanding; window and ledger name every message.
    pos = run.state["cursor"]["position"]
    assert 0 < len(pos["window"]) <= 100 and len(set(pos["ledger"]) | set(pos["window"])) == 600
    assert ps.leftover(topic, 0) == 0  # acked: nothing to pull (the deadline is not even needed)


def test_a_batch_slower_than_the_ack_deadline_is_not_redelivered(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic = name(request)
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE)
    n = 20
    produce(ps, topic, n)
    src = source(ps, sub)
    seen: dict[str, Any] = {}
    spy = ps.subscriber()

    def slow(rec: dict[str, Any]) -> dict[str, Any]:
        if rec["k"] == 0 and not seen:
            # A GPU batch that outlives the deadline: hold it until the lease extended the
            # deadline four times (past 4/3 of it), then look from another client.
            t0 = time.monotonic()
            while src.extensions < 4:
                assert time.monotonic() - t0 < 120, "the lease never extended the deadline"
                time.sleep(0.05)
            seen["held_s"] = time.monotonic() - t0
            seen["outstanding"] = src._outstanding()
            got = spy.pull(request={"subscription": sub, "max_messages": 100}, timeout=5, retry=None)
            seen["stolen"] = len(got.received_messages)
        return fn(rec)

    run = FakeRun()
    out = run_map(run.attempt(), src, slow, JsonlSink(tmp_path / "out"), read_batch=n)
    spy.close()
    assert seen["held_s"] > DEADLINE, seen
    # Every message was pulled and held through the batch, and none was handed to anyone else.
    assert seen["outstanding"] == n and seen["stolen"] == 0, seen
    assert src.redelivered == 0 and out["records_in"] == n
    check_once(tmp_path / "out", n)
    assert ps.leftover(topic, DEADLINE + 1) == 0


def test_a_crash_between_commit_and_ack_drops_the_redelivered_messages_by_the_ledger(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    topic = name(request)
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE, dead_letter_max=100)  # no count commits
    produce(ps, topic, 300)
    run = FakeRun()
    with pytest.raises(Crash):  # committed the third batch, then died: published by the restore
        run_map(run.attempt(crash="after", crash_after=2), source(ps, sub), fn,
                JsonlSink(tmp_path / "out"), read_batch=50)
    pos = run.state["cursor"]["position"]
    window, committed = set(pos["window"]), set(pos["ledger"]) | set(pos["window"])
    assert window and len(read_jsonl_dir(tmp_path / "out")) == len(committed) - len(window)
    got: list[int] = []

    def spy(rec: dict[str, Any]) -> dict[str, Any]:
        got.append(rec["k"])
        return fn(rec)

    src = source(ps, sub)
    run_map(run.attempt(), src, spy, JsonlSink(tmp_path / "out"), read_batch=50)
    check_once(tmp_path / "out", 300)
    # The committed, unacked window came back and was dropped by the ledger, not redone.
    assert src.dropped == len(window) and len(got) == 300 - len(committed), (src.dropped, len(got))
    assert ps.leftover(topic, 0) == 0


@pytest.mark.parametrize("policy", ["dead-letter-policy", "no-policy"])
def test_poison_and_bad_messages_go_to_the_dead_letter_file_and_are_acked(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest, policy: str
) -> None:
    topic = name(request)
    dl = 5 if policy == "dead-letter-policy" else None
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE, dead_letter_max=dl)
    killers = ps.publish(topic, [json.dumps({"k": k, "v": f"value-{k}"}) for k in range(3)])
    home = tmp_path / "home"
    run = FakeRun()

    def killer(rec: dict[str, Any]) -> dict[str, Any]:  # every message kills its worker
        raise Crash()

    for _ in range(3):
        with pytest.raises(Crash):
            run_map(run.attempt(), source(ps, sub, max_deliveries=3), killer,
                    JsonlSink(tmp_path / "out"), read_batch=30)
    if policy == "no-policy":
        # Pub/Sub counts nothing: the pulls are counted in the position, committed first.
        assert run.state["cursor"]["position"]["counts"] == dict.fromkeys(killers, 3)
    produce(ps, topic, 17, first=3)
    bad = ps.publish(topic, ["{not json", b"\xff\xfe"])
    ctx = run.attempt()
    ctx.home = str(home)  # type: ignore[attr-defined]
    src = source(ps, sub, max_deliveries=3)
    out = run_map(ctx, src, fn, JsonlSink(tmp_path / "out"), read_batch=30)
    assert out["failures"] == 5 and out["records_out"] == 17, out
    dead = read_jsonl_dir(home / "dead-letter" / "run1" / "step1", "dead-*.jsonl")
    errors = sorted(d["error"] for d in dead)
    assert sum("was delivered 4 times, more than max_deliveries=3" in e for e in errors) == 3, errors
    assert {json.loads(d["raw"])["data"] for d in dead if "delivered" in d["error"]} == {
        json.dumps({"k": k, "v": f"value-{k}"}) for k in range(3)
    }
    assert sum(e.startswith(f"message {bad[0]} is not valid JSON") for e in errors) == 1, errors
    assert sum(e.startswith(f"message {bad[1]} is not UTF-8") for e in errors) == 1, errors
    assert ps.leftover(topic, 0) == 0  # dead-lettered messages are acked too


def test_continuous_reads_park_on_a_pause_and_a_resume_reads_what_was_published_meanwhile(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture
) -> None:
    from segue._park import Park

    topic = name(request)
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE, retention_s=600)
    produce(ps, topic, 200)
    run = FakeRun()
    now = [1_000_000.0]
    # Continuous: no drain rule, so only the pause ends the first attempt.
    src = source(ps, sub, drain_after_empty_reads=None, drain_idle_s=None, max_outstanding=40,
                 wall=lambda: now[0])
    with pytest.raises(Park):
        run_map(run.attempt(pause_after=3), src, fn, JsonlSink(tmp_path / "out"), read_batch=40)
    published = len(read_jsonl_dir(tmp_path / "out"))
    assert 0 < published < 200 and src.acked == published
    produce(ps, topic, 100, first=200)  # a producer goes on while the step is parked
    now[0] += 700  # parked for 11.7 minutes of the subscription's 10 of retention
    with caplog.at_level(logging.WARNING, logger="segue.data.sources.pubsub"):
        run_map(run.attempt(), source(ps, sub, wall=lambda: now[0]), fn,
                JsonlSink(tmp_path / "out"), read_batch=40)
    check_once(tmp_path / "out", 300)
    warned = [r.getMessage() for r in caplog.records if "retains" in r.getMessage()]
    assert len(warned) == 1 and "for 10.0 min" in warned[0] and "11.7 min ago" in warned[0], warned
    assert ps.leftover(topic, 0) == 0


def test_a_drain_after_a_crash_waits_out_the_dead_attempts_leases(
    ps: PubSubEmulator, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A SIGKILLed attempt gives nothing back: its messages return at their deadline, and
    the next attempt must not call the subscription drained before they do."""
    topic = name(request)
    sub = ps.create(topic, topic, ack_deadline_s=DEADLINE)
    produce(ps, topic, 30)
    thief = ps.subscriber()  # plays the killed attempt: pulls, never acks, never gives back
    got = thief.pull(request={"subscription": sub, "max_messages": 30}, timeout=5, retry=None)
    held = len(got.received_messages)
    assert held > 0
    thief.close()
    run = FakeRun()
    run.epoch = 1  # the next attempt is the second
    out = run_map(run.attempt(), source(ps, sub), fn, JsonlSink(tmp_path / "out"), read_batch=50)
    assert out["records_in"] == 30, out
    check_once(tmp_path / "out", 30)


def test_bad_arguments_are_refused_at_once() -> None:
    from segue.data.sources.pubsub import PubSubSource
    from segue.errors import DataError

    with pytest.raises(ValueError, match=r"^max_outstanding must be >= 1, not 0$"):
        PubSubSource("projects/p/subscriptions/s", max_outstanding=0)
    with pytest.raises(ValueError, match=r"^ack_deadline_s must be within 10..600, not 5$"):
        PubSubSource("projects/p/subscriptions/s", ack_deadline_s=5)
    with pytest.raises(DataError, match=r"^subscription 'sub' needs project= \(or give its full path\)$"):
        PubSubSource("sub").probe()
    assert PubSubSource("sub", project="p").input_name == "projects/p/subscriptions/sub"


def test_the_lease_thread_stops_with_the_attempt(
    ps: PubSubEmulator, request: pytest.FixtureRequest
) -> None:
    topic = name(request)
    sub = ps.create(topic, topic)
    src = source(ps, sub)

    class Scope:
        run_id, step, epoch = "r", "s", 1

    src.attach(Scope())
    assert any(t.name == "segue-pubsub-lease" for t in threading.enumerate())
    src.close()
    assert not any(t.name == "segue-pubsub-lease" for t in threading.enumerate())
