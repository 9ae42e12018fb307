"""A Redis stream through a map step under real SIGKILLs, a pause and a broker restart, via the CLI.

Every fault is gated on observed progress (a new committed checkpoint of the
running attempt, tests/campaign_kit.py) and counted when it lands. One kill is
aimed exactly between the sink's commit and the XACK by the ``queue.before_ack``
fault point, armed for the first attempt only. At the end every message's output
is published exactly once and the group has nothing pending; at the pause the
acknowledged messages are exactly those whose outputs are published.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import FAST, Campaign, check_keys_once

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RedisServer, redis_skip_reason, serve  # noqa: E402
from segue_helpers import wait_for  # noqa: E402

FLOW = str(Path(__file__).parent / "flows" / "queueflow.py")
GROUP = "segue-consume"
N = 2000
# The campaign is 100,000 messages and >= 20 SIGKILLs per sink:
# `python -m benchmarks.queues --campaign` runs it (or SEGUE_REDIS_CAMPAIGN_N=100000 here).
# The suite's default keeps the kills and shrinks the stream, to fit CI's time.
CAMPAIGN_N = int(os.environ.get("SEGUE_REDIS_CAMPAIGN_N", "10000"))
CAMPAIGN_KILLS = int(os.environ.get("SEGUE_REDIS_CAMPAIGN_KILLS", "20"))


@pytest.fixture()
def redis_server(tmp_path: Path) -> Any:
    yield from serve(RedisServer.start, redis_skip_reason(), tmp_path / "redis")


def produce(r: Any, stream: str, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for k in range(n):
        pipe.xadd(stream, {"data": json.dumps({"k": k, "v": f"value-{k:08d}"})})
        if k % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def read_output(kind: str, out: Path, r: Any) -> list[tuple[int, str]]:
    if kind == "redis":
        return [(x["k"], x["v"]) for x in (json.loads(f["data"]) for _, f in r.xrange("out"))]
    if kind == "parquet":
        import pyarrow.parquet as pq

        return [
            (r["k"], r["v"])
            for p in sorted(out.glob("part-*.parquet"))
            for r in pq.read_table(p).to_pylist()
        ]
    rows = []
    for p in sorted(out.glob("part-*.jsonl")):
        rows.extend((r["k"], r["v"]) for r in map(json.loads, p.read_text().splitlines()))
    return rows


def acked_keys(r: Any, stream: str) -> set[int]:
    """Keys of the messages the group acknowledged: delivered (up to its last-delivered id), not pending."""
    info = next(g for g in r.xinfo_groups(stream) if g["name"] == GROUP)
    last = info["last-delivered-id"]
    pel = {e["message_id"] for e in r.xpending_range(stream, GROUP, "-", "+", 1_000_000)}
    return {json.loads(f["data"])["k"] for mid, f in r.xrange(stream, "-", last) if mid not in pel}


def check_all_acked(r: Any, stream: str, n: int) -> None:
    assert r.xpending(stream, GROUP)["pending"] == 0
    info = next(g for g in r.xinfo_groups(stream) if g["name"] == GROUP)
    assert info["lag"] == 0 and info["entries-read"] == n, info
    assert acked_keys(r, stream) == set(range(n))


def start(
    s: Any,
    server: RedisServer,
    stream: str,
    out: Path,
    kind: str,
    hold: Path,
    env: dict[str, str] | None = None,
    hold_k: int = N - 1,
    sleep: str = "sleep_ms=2",
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s(
        "run",
        FLOW,
        "--run-id",
        "q",
        "-p",
        f"url={server.url}",
        "-p",
        f"stream={stream}",
        "-p",
        f"out={out}",
        "-p",
        f"sink={kind}",
        "-p",
        sleep,
        "-p",
        f"hold={hold}",
        "-p",
        f"hold_k={hold_k}",
        "--detach",
        env=env,
        check=True,
    )


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "redis"])
@pytest.mark.timeout(600)
def test_sigkills_between_commit_and_ack_and_a_pause_exactly_once(
    segue: Any, redis_server: RedisServer, tmp_path: Path, kind: str
) -> None:
    if kind == "parquet":
        pytest.importorskip("pyarrow", reason="pyarrow is not installed; pip install pyarrow")
    s, r, out, hold = segue, redis_server.client(), tmp_path / "out", tmp_path / "hold"
    s.env.update(FAST)
    produce(r, "in", N)
    # The first attempt SIGKILLs itself right after its third commit and publish, before the XACK.
    start(
        s,
        redis_server,
        "in",
        out,
        kind,
        hold,
        env={
            "SEGUE_FAULTS": "queue.before_ack:kill:3",
            "SEGUE_FAULTS_IN": "worker",
            "SEGUE_FAULTS_EPOCHS": "1",
        },
    )
    c = Campaign(s, "q", hold, timeout=500)
    try:
        c.land_armed_kill(3)  # it died after its third commit: between commit and ack
        c.fire("kill_worker", 1)
        c.fire("kill_controller", 1)
        c.fire("pause", 1)
        # Parked: what is acknowledged is exactly what is published.
        published = read_output(kind, out, r)
        assert acked_keys(r, "in") == {k for k, _ in published}
        assert len(published) < N
        c.fire("kill_worker", 1)  # resumes the paused run first (segue resume), then kills it
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    assert dict(c.landed) == {
        "kill_before_ack": 1,
        "kill_worker": 2,
        "kill_controller": 1,
        "pause": 1,
    }, c.log
    assert c.recorded_worker_sigkills() >= 3
    check_keys_once(read_output(kind, out, r), N)
    check_all_acked(r, "in", N)
    print(
        f"redis stream campaign {kind}: landed {dict(c.landed)}, missed {dict(c.missed)}, log {c.log}"
    )


def redis_campaign(s: Any, server: RedisServer, tmp: Path, kind: str, n: int, kills: int,
                   seed: int = 39, sleep: str = "sleep_ms=1", timeout: float = 3000) -> dict[str, Any]:
    """``n`` messages from a stream through the map step into ``kind`` (jsonl or the Redis
    stream sink) under ``kills`` SIGKILLs (the first aimed between the sink's commit and the
    XACK by a fault point, then every 4th of the controller), each gated on a new committed
    checkpoint of the running attempt and counted when it lands. Checks every message
    published once with its transform (what a clean run publishes), the group's pending
    list empty and every entry acked; returns the figures."""
    r, out, hold = server.client(), tmp / "out", tmp / "hold"
    s.env.update(FAST)
    t0 = time.monotonic()
    produce(r, "in", n)
    start(s, server, "in", out, kind, hold, hold_k=n - 1, sleep=sleep, env={
        "SEGUE_FAULTS": "queue.before_ack:kill:3", "SEGUE_FAULTS_IN": "worker",
        "SEGUE_FAULTS_EPOCHS": "1"})
    c = Campaign(s, "q", hold, timeout=timeout)
    rng = random.Random(seed)
    try:
        c.land_armed_kill(3)
        for i in range(kills - 1):
            c.fire("kill_controller" if (i + 1) % 4 == 0 else "kill_worker", rng.randint(1, 2))
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    seconds = time.monotonic() - t0
    got = read_output(kind, out, r)
    done = {"sink": kind, "messages": n, "outputs": len(got), "landed": dict(c.landed),
            "sigkills_landed": sum(c.landed.values()), "missed": dict(c.missed),
            "recorded_worker_sigkills": c.recorded_worker_sigkills(),
            "lost": len(set(range(n)) - {k for k, _ in got}),
            "duplicated": len(got) - len({k for k, _ in got}),
            "xpending_at_end": int(r.xpending("in", GROUP)["pending"]),
            "seconds": round(seconds, 1)}
    check_keys_once(got, n)  # equal to a clean run's output: every key once, transformed
    check_all_acked(r, "in", n)
    return done


@pytest.mark.parametrize("kind", ["jsonl", "redis"])
@pytest.mark.timeout(3600)
def test_a_campaign_of_twenty_sigkills_exactly_once(
    segue: Any, redis_server: RedisServer, tmp_path: Path, kind: str
) -> None:
    """The issue's campaign, at CAMPAIGN_N messages (100,000 with --campaign)."""
    done = redis_campaign(segue, redis_server, tmp_path, kind, CAMPAIGN_N, CAMPAIGN_KILLS)
    assert done["sigkills_landed"] >= CAMPAIGN_KILLS, done
    assert done["landed"]["kill_before_ack"] == 1, done
    assert done["landed"]["kill_controller"] == (CAMPAIGN_KILLS - 1) // 4, done
    want_worker = CAMPAIGN_KILLS - 1 - (CAMPAIGN_KILLS - 1) // 4
    assert done["landed"]["kill_worker"] == want_worker, done
    assert done["recorded_worker_sigkills"] >= want_worker - (CAMPAIGN_KILLS - 1) // 4, done
    print(f"redis stream campaign: {json.dumps(done)}")


@pytest.mark.timeout(600)
def test_broker_sigkilled_and_restarted_mid_run_exactly_once(
    segue: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    s, r, out, hold = segue, redis_server.client(), tmp_path / "out", tmp_path / "hold"
    s.env.update(FAST)
    produce(r, "in", N)
    start(s, redis_server, "in", out, "jsonl", hold)
    c = Campaign(s, "q", hold, timeout=500)
    try:
        t = c._wait(lambda: c._progressed(2), "two checkpoints before the broker is killed")
        redis_server.kill()
        # The attempt that lost its broker fails; the controller retries with backoff.
        wait_for(lambda: c._task().epoch > t.epoch, 120, "an attempt to fail without its broker")
        redis_server.kill_and_restart()  # from the append-only file (appendfsync always)
        r = redis_server.client()
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    lost_broker = [
        e for e in c.store.list_events("q") if e.kind == "failure" and "ConnectionError" in e.reason
    ]
    assert lost_broker, "no attempt failed while the broker was down"
    check_keys_once(read_output("jsonl", out, r), N)
    check_all_acked(r, "in", N)


DECLARED = str(Path(__file__).parent / "flows" / "redisdecor.py")


@pytest.mark.parametrize("case", ["unreachable", "missing-stream"])
def test_bad_input_is_refused_at_submit_in_one_line(
    segue: Any, redis_server: RedisServer, tmp_path: Path, case: str
) -> None:
    import subprocess

    from brokerkit import free_port

    redis_server.client().xadd("in", {"data": json.dumps({"k": 0, "v": "a"})})
    nowhere = free_port()
    url, stream, expected = {
        "unreachable": (f"redis://127.0.0.1:{nowhere}/0", "in",
                        f"cannot reach the Redis server at redis://127.0.0.1:{nowhere}/0 ("),
        "missing-stream": (redis_server.url, "no-such-stream",
                           f"stream 'no-such-stream' does not exist at {redis_server.url}; check the "
                           f"name, or pass create_stream=True to wait for a producer"),
    }[case]
    proc = subprocess.run(
        [sys.executable, "-m", "segue", "run", DECLARED, "-p", f"url={url}", "-p",
         f"stream={stream}", "-p", f"out={tmp_path / 'out'}"],
        capture_output=True, text=True, env=segue.env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"segue: step 'upper': {expected}"), proc.stderr
    assert not segue.home.exists(), "a refused run must not create the home"
    assert not (tmp_path / "out").exists()
    # The stream was only looked at: no consumer group was created by the probe.
    if case == "missing-stream":
        assert not redis_server.client().exists("no-such-stream")
    else:
        assert [g["name"] for g in redis_server.client().xinfo_groups("in")] == []
