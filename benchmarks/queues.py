"""A Redis stream through segue's map step against a plain redis-py consumer (issue 39).

    python -m benchmarks.queues --quick --json

Both sides read the same N messages from a stream on one redis-server (append-only
file, ``appendfsync always``, as a broker that must not lose an ack), apply the same
transform, write JSONL durably and acknowledge in batches of the same size:

- **plain**: ``benchmarks._plain_queue``, XREADGROUP -> write -> fsync -> XACK per batch,
  in a process of its own (at-least-once: a crash between fsync and ack duplicates);
- **segue**: ``benchmarks/flows/queue_flow.py``, a map step with ``RedisStreamSource`` and
  ``JsonlSink``, a checkpoint every second; messages are acked after the checkpoint that
  covers their output commits (exactly-once). Timed from the controller's spawn to
  SUCCEEDED in the store, so both sides pay their processes' start.

Each try gets a fresh stream; outputs are checked equal (every key once, same values)
before a ratio is printed. ``vs_plain_consumer`` = plain time / segue time (goal >= 0.8),
the median over tries with both sides' samples. ``redelivered_after_kill``: one more segue
run whose worker is SIGKILLed once half the messages are acked: the messages its flow
processed twice (counted from a trace file) and the seconds from the kill to the first new
acknowledgement (``time_to_first_new_ack_s``, polled from ``XINFO GROUPS``). The kill lands at a
seeded moment (0.2-0.8 s) after a third of the messages were processed (the message at 2/3
waits until then, so the run cannot end first).

    python -m benchmarks.queues --campaign [--messages 100000] [--kills 20] [--amqp]

runs the issue's kill campaign instead (tests/data/test_redis_stream_kills.py's
``redis_campaign``, the same code the suite runs at 10,000 messages): ``--messages``
(default 100,000) from a stream through the map step into JSONL, then into the Redis
stream sink, each under ``--kills`` landed SIGKILLs of the worker and the controller
(counted), checked against a clean run's output (every key once, transformed), with
``XPENDING`` empty and every entry acked at the end. ``--amqp`` adds RabbitMQ's campaign
(tests/data/test_rabbitmq_kills.py at 50,000 messages, through pytest).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from segue.home import Home
from segue.run import ops
from segue.states import RunState

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "queue_flow.py"
GROUP = "segue-consume"  # RedisStreamSource's default group for the step `consume`


class Redis:
    """A throwaway redis-server on a free loopback port (tests/brokerkit.py for the tests)."""

    def __init__(self, root: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        root.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(root),
             "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        pb.wait_until(self._ping, 30, 0.05, "redis-server to answer")

    def client(self) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def _ping(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    try:
        import redis  # noqa: F401
    except ImportError:
        return "redis-py is not installed: pip install 'segue[redis]'"
    if not (shutil.which("redis-server") or os.path.exists("/usr/bin/redis-server")):
        return "no redis-server: apt-get install redis-server (make install-dev does it)"
    return None


def produce(r: Any, stream: str, n: int) -> None:
    pipe = r.pipeline(transaction=False)
    for k in range(n):
        pipe.xadd(stream, {"data": json.dumps({"k": k, "v": f"message {k:08d}"})})
        if k % 5000 == 4999:
            pipe.execute()
    pipe.execute()


def read_jsonl(files: list[Path]) -> list[tuple[int, str]]:
    rows: list[tuple[int, str]] = []
    for p in files:
        with open(p, encoding="utf-8") as f:
            rows.extend((d["k"], d["v"]) for d in map(json.loads, f))
    return rows


def check(rows: list[tuple[int, str]], n: int) -> str | None:
    """Why ``rows`` is not every message once with its transform; None when it is."""
    if not rows:
        return "nothing was compared: no output records"
    keys = sorted(k for k, _ in rows)
    if keys != list(range(n)):
        return f"{len(rows)} records, {len(set(keys))} distinct keys, {n} messages"
    bad = [k for k, v in rows if v != f"MESSAGE {k:08d}"]
    return f"{len(bad)} records differ (first key {bad[0]})" if bad else None


def acked(r: Any, stream: str, group: str) -> int:
    """Entries the group acknowledged: read by it and no longer pending."""
    for g in r.xinfo_groups(stream):
        if g["name"] == group:
            return int(g.get("entries-read") or 0) - int(g["pending"])
    return 0


def plain_try(rs: Redis, work: Path, n: int, batch: int, i: int) -> dict[str, Any]:
    stream, out = f"plain-{i}", work / f"plain-{i}.jsonl"
    produce(rs.client(), stream, n)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "benchmarks._plain_queue", rs.url, stream, str(out),
                    str(batch)], check=True, capture_output=True, env=env, timeout=1800)
    wall = time.perf_counter() - t0
    return {"s": wall, "why_not_equal": check(read_jsonl([out]), n)}


class SegueSide:
    def __init__(self, work: Path) -> None:
        self.work = work
        pb.private_pool(work)
        self.home = Home.resolve(work / "home")
        self.store = self.home.open_store()

    def start(self, rs: Redis, stream: str, out: Path, batch: int, trace: str = "", hold: str = "",
              hold_k: int = -1) -> str:
        params = {"url": rs.url, "stream": stream, "out": str(out), "batch": batch, "trace": trace,
                  "hold": hold, "hold_k": hold_k}
        prepared = ops.prepare_run(FLOW, params, run_id=stream)
        ops.create_run(self.store, prepared)
        ops.spawn_detached(self.home, stream)
        return stream

    def wait_done(self, run: str, timeout: float = 1800) -> None:
        state = pb.wait_until(lambda: (s := self.store.get_run(run).state) in (
            RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED) and s, timeout, 0.01,
            f"run {run} to end")
        if state != RunState.SUCCEEDED:
            raise SystemExit(f"segue run {run} ended {state.value}: see {self.home.root}")

    def timed(self, rs: Redis, n: int, batch: int, i: int) -> dict[str, Any]:
        stream, out = f"segue-{i}", self.work / f"segue-{i}"
        produce(rs.client(), stream, n)
        t0 = time.perf_counter()
        run = self.start(rs, stream, out, batch)
        self.wait_done(run)
        wall = time.perf_counter() - t0
        return {"s": wall, "why_not_equal": check(read_jsonl(sorted(out.glob("part-*.jsonl"))), n)}

    def killed(self, rs: Redis, n: int, batch: int, seed: int) -> dict[str, Any]:
        stream, out, trace = "segue-kill", self.work / "segue-kill", self.work / "trace"
        r = rs.client()
        produce(r, stream, n)
        hold = self.work / "hold"  # the message 2n/3 waits for it: the run outlives the kill
        run = self.start(rs, stream, out, batch, trace=str(trace), hold=str(hold), hold_k=2 * n // 3)
        task = lambda: self.store.get_task(run, "consume")  # noqa: E731

        def processed() -> int:
            return trace.read_bytes().count(b"\n") if trace.exists() else 0

        # A third processed, then a kill at a seeded moment within the next checkpoint interval
        # (1 s): a kill right at an ack would find nothing in flight.
        pb.wait_until(lambda: processed() >= n // 3, 600, 0.01, "a third of the messages processed")
        time.sleep(random.Random(seed).uniform(0.2, 0.8))
        t = pb.wait_until(lambda: (x := task()).pid and x, 60, 0.01, "the running attempt")
        before = acked(r, stream, GROUP)
        t0 = time.perf_counter()
        os.kill(t.pid, signal.SIGKILL)
        hold.touch()
        pb.wait_until(lambda: acked(r, stream, GROUP) > before, 600, 0.005, "a new ack after the kill")
        first_ack = time.perf_counter() - t0
        self.wait_done(run)
        total = processed()
        fails = [e for e in self.store.list_events(run) if e.kind == "failure" and "SIGKILL" in e.reason]
        return {"redelivered_after_kill": total - n, "time_to_first_new_ack_s": round(first_ack, 3),
                "kills_landed": len(fails), "acked_at_kill": before,
                "why_not_equal": check(read_jsonl(sorted(out.glob("part-*.jsonl"))), n),
                "xpending_at_end": int(r.xpending(stream, GROUP)["pending"])}


def campaign(n: int, kills: int, amqp: bool) -> dict[str, Any]:
    """The issue's kill campaigns, through the tests' own campaign code (see the docstring)."""
    root = Path(__file__).resolve().parent.parent
    for d in (root / "tests", root / "tests" / "data"):
        sys.path.insert(0, str(d))
    from brokerkit import RedisServer
    from segue_helpers import Segue
    from test_redis_stream_kills import redis_campaign

    out: dict[str, Any] = {"messages": n, "kills": kills, "redis": []}
    for kind in ("jsonl", "redis"):
        work = Path(tempfile.mkdtemp(prefix=f"segue-campaign-{kind}-"))
        pb.private_pool(work)
        server = RedisServer.start(work / "redis")
        try:
            done = redis_campaign(Segue(work / "home"), server, work, kind, n, kills,
                                  sleep="sleep_us=500")
        finally:
            server.stop()
        out["redis"].append(done)
        print(json.dumps(done), file=sys.stderr, flush=True)
        shutil.rmtree(work, ignore_errors=True)
    if amqp:
        env = {**os.environ, "SEGUE_AMQP_CAMPAIGN_N": "50000"}
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             str(root / "tests" / "data" / "test_rabbitmq_kills.py"), "-k", "sigkill_campaign"],
            capture_output=True, text=True, env=env, cwd=root, timeout=3600)
        line = next((x for x in proc.stdout.splitlines() if "rabbitmq campaign:" in x), "")
        out["rabbitmq"] = {"passed": proc.returncode == 0, "summary": line.strip(),
                           "seconds": round(time.monotonic() - t0, 1)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.queues")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="100k messages, 3 tries a side")
    mode.add_argument("--smoke", action="store_true", help="2k messages, 1 try: checks it runs (CI)")
    mode.add_argument("--campaign", action="store_true",
                      help="the kill campaign: 100k messages, 20 SIGKILLs, JSONL and Redis sinks")
    ap.add_argument("--kills", type=int, default=20, help="--campaign: SIGKILLs to land per sink")
    ap.add_argument("--amqp", action="store_true", help="--campaign: RabbitMQ's too (50k messages)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line")
    ap.add_argument("--messages", type=int, default=None)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--tries", type=int, default=None)
    ap.add_argument("--seed", type=int, default=1, help="when, within a checkpoint interval, the kill lands")
    a = ap.parse_args(argv)
    why = missing()
    if why:  # as benchmarks.cluster without PostgreSQL: said, not failed
        print(json.dumps({"skipped": why}))
        return
    if a.campaign:
        print(json.dumps(campaign(a.messages or 100_000, a.kills, a.amqp)))
        return
    n = a.messages or (2_000 if a.smoke else 100_000 if a.quick else 300_000)
    tries = a.tries or (1 if a.smoke else 3)
    work = Path(tempfile.mkdtemp(prefix="segue-bench-queues-"))
    rs = Redis(work / "redis")
    try:
        seg = SegueSide(work)
        plain, segue = [], []
        for i in range(tries):  # alternate the sides, so drift on a loaded machine hits both
            plain.append(plain_try(rs, work, n, a.batch, i))
            segue.append(seg.timed(rs, n, a.batch, i))
        kill = seg.killed(rs, n, a.batch, a.seed)
    finally:
        rs.stop()
        shutil.rmtree(work, ignore_errors=True)
    wrong = [x["why_not_equal"] for x in plain + segue + [kill] if x["why_not_equal"]]
    if wrong:  # no ratio over outputs that differ
        raise SystemExit(f"outputs differ, no figure printed: {wrong}")
    ps, ss = [x["s"] for x in plain], [x["s"] for x in segue]
    ratio = statistics.median(ps) / statistics.median(ss)
    out = {
        "messages": n, "batch": a.batch, "tries": tries,
        "vs_plain_consumer": round(ratio, 3),
        "plain_s": [round(x, 3) for x in ps], "segue_s": [round(x, 3) for x in ss],
        "plain_msgs_per_s": round(n / statistics.median(ps)),
        "segue_msgs_per_s": round(n / statistics.median(ss)),
        "redelivered_after_kill": kill["redelivered_after_kill"],
        "time_to_first_new_ack_s": kill["time_to_first_new_ack_s"],
        "kill": {k: kill[k] for k in ("kills_landed", "acked_at_kill", "xpending_at_end")},
        "outputs_equal": True,
        "goals": {"vs_plain_consumer": {"target": 0.8, "value": round(ratio, 3), "met": ratio >= 0.8}},
    }
    if a.smoke:
        out["notes"] = ["--smoke: 2k messages, one try; figures mean nothing, the run checks it works"]
    if not a.json:
        for k, v in out.items():
            print(f"{k:>26}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
