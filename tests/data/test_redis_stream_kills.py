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
import sys
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


@pytest.fixture()
def redis_server(tmp_path: Path) -> Any:
    yield from serve(RedisServer.start, redis_skip_reason(), tmp_path / "redis")


def produce(r: Any, stream: str, n: int) -> None:
    pipe = r.pipeline()
    for k in range(n):
        pipe.xadd(stream, {"data": json.dumps({"k": k, "v": f"value-{k:08d}"})})
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
    pel = {e["message_id"] for e in r.xpending_range(stream, GROUP, "-", "+", 100_000)}
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
        "sleep_ms=2",
        "-p",
        f"hold={hold}",
        "-p",
        f"hold_k={N - 1}",
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
