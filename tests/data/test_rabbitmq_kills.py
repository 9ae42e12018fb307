"""A RabbitMQ queue through a map step under real SIGKILLs, a pause with a producer going on,
broker restarts and bad input, via the CLI, against a real rabbitmq-server.

Every fault is gated on observed progress (a new committed checkpoint of the
running attempt, tests/campaign_kit.py) and counted when it lands. One kill is
aimed exactly between the sink's commit and the ack by the ``queue.before_ack``
fault point, armed for the first attempt only: the redelivered messages must be
dropped by the ledger, not published again. At the end every message's output is
published exactly once (the set a clean run publishes: each key once, its value
transformed), and the queue has nothing ready and no consumer (so nothing unacked).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import FAST, Campaign, check_keys_once

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RabbitMQServer, free_port, rabbitmq_skip_reason, serve  # noqa: E402
from segue_helpers import wait_for  # noqa: E402

FLOW = str(Path(__file__).parent / "flows" / "queueflow.py")
DECLARED = str(Path(__file__).parent / "flows" / "amqpdecor.py")
# The issue asks for 50,000 messages: SEGUE_AMQP_CAMPAIGN_N=50000 (3m25s on the 2-core
# machine, broker start included; 25 SIGKILLs landed); 20,000 by default takes about 2.
CAMPAIGN_N = int(os.environ.get("SEGUE_AMQP_CAMPAIGN_N", "20000"))
PAUSED_EXTRA = 1000  # published while the run is paused
KILLS = 24  # every 4th one of the controller


@pytest.fixture(scope="module")
def mq(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from serve(RabbitMQServer.start, rabbitmq_skip_reason(), tmp_path_factory.mktemp("mq"))


@pytest.fixture()
def own_mq(tmp_path: Path) -> Any:
    """A broker of the test's own: it is killed and restarted."""
    yield from serve(RabbitMQServer.start, rabbitmq_skip_reason(), tmp_path / "rabbitmq")


def produce(mq: RabbitMQServer, queue: str, first: int, n: int) -> None:
    """Publish keys first..first+n-1, each confirmed by the broker."""
    keys = range(first, first + n)
    bodies = [json.dumps({"k": k, "v": f"value-{k:08d}"}) for k in keys]
    mq.publish(queue, bodies, [f"m{k}" for k in keys])


def read_output(out: Path) -> list[tuple[int, str]]:
    rows = []
    for p in sorted(out.glob("part-*.jsonl")):
        rows.extend((r["k"], r["v"]) for r in map(json.loads, p.read_text().splitlines()))
    return rows


def check_queue_settled(mq: RabbitMQServer, queue: str) -> None:
    # No consumer is left, so an unacked message would be ready again: nothing is either.
    wait_for(lambda: mq.counts(queue) == (0, 0), 30, f"queue {queue!r} to be empty, unconsumed")


def start(s: Any, mq: RabbitMQServer, queue: str, out: Path, hold: Path, hold_k: int,
          sleep_ms: int, env: dict[str, str] | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    params = {"url": mq.url, "stream": queue, "out": out, "sink": "jsonl", "sleep_ms": sleep_ms,
              "hold": hold, "hold_k": hold_k}
    args = [a for k, v in params.items() for a in ("-p", f"{k}={v}")]
    s("run", FLOW, "--run-id", "q", *args, "--detach", env=env, check=True)


@pytest.mark.timeout(900)
def test_sigkill_campaign_with_a_paused_producer_exactly_once(
    segue: Any, mq: RabbitMQServer, tmp_path: Path
) -> None:
    s, out, hold, queue = segue, tmp_path / "out", tmp_path / "hold", "campaign"
    s.env.update(FAST)
    mq.declare(queue)
    produce(mq, queue, 0, CAMPAIGN_N)
    total = CAMPAIGN_N + PAUSED_EXTRA
    t0 = time.monotonic()
    # The first attempt SIGKILLs itself right after its third commit and publish, before the ack.
    start(s, mq, queue, out, hold, CAMPAIGN_N - 1, sleep_ms=1, env={
        "SEGUE_FAULTS": "queue.before_ack:kill:3", "SEGUE_FAULTS_IN": "worker",
        "SEGUE_FAULTS_EPOCHS": "1"})
    c = Campaign(s, "q", hold, timeout=800)
    rng = random.Random(39)
    try:
        c.land_armed_kill(3)  # it died after its third commit: between commit and ack
        plan = ["kill_controller" if (i + 1) % 4 == 0 else "kill_worker" for i in range(KILLS)]
        plan.insert(3, "pause")
        for action in plan:
            c.fire(action, rng.randint(1, 2))
            if action == "pause":
                # Parked: the acknowledged messages are exactly those whose outputs are
                # published (no consumer: every unacked one is ready again).
                published = read_output(out)
                ready, consumers = mq.counts(queue)
                assert consumers == 0 and ready == CAMPAIGN_N - len(published), (ready, len(published))
                produce(mq, queue, CAMPAIGN_N, PAUSED_EXTRA)  # a producer goes on meanwhile
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    seconds = time.monotonic() - t0
    kills = {k: v for k, v in c.landed.items() if k != "pause"}
    assert c.landed["pause"] == 1 and sum(kills.values()) == KILLS + 1, c.log
    assert kills["kill_controller"] == KILLS // 4, c.log
    assert c.recorded_worker_sigkills() >= c.landed["kill_worker"] - KILLS // 4, c.log
    check_keys_once(read_output(out), total)
    check_queue_settled(mq, queue)
    print(f"rabbitmq campaign: {total} messages, landed {dict(c.landed)} "
          f"({sum(kills.values())} SIGKILLs), missed {dict(c.missed)}, {seconds:.0f}s")


@pytest.mark.parametrize("how", ["sigkill", "stop_app"])
@pytest.mark.timeout(600)
def test_a_broker_restart_mid_run_is_retried_and_loses_nothing(
    segue: Any, own_mq: RabbitMQServer, tmp_path: Path, how: str
) -> None:
    s, mq, out, hold, queue, n = segue, own_mq, tmp_path / "out", tmp_path / "hold", "in", 2000
    s.env.update(FAST)
    mq.declare(queue)  # durable, quorum; the messages are persistent
    produce(mq, queue, 0, n)
    start(s, mq, queue, out, hold, n - 1, sleep_ms=2)
    c = Campaign(s, "q", hold, timeout=500)
    try:
        t = c._wait(lambda: c._progressed(2), "two checkpoints before the broker goes")
        if how == "sigkill":
            mq.kill()
        else:
            mq.ctl("stop_app")
        hold.write_text("go")  # an attempt held at the last message must reach the broker too
        # The attempt that lost its broker fails; the controller retries with backoff.
        wait_for(lambda: c._task().epoch > t.epoch, 120, "an attempt to fail without its broker")
        if how == "sigkill":
            mq.kill_and_restart()  # the node recovers the durable queue from its data dir
        else:
            mq.ctl("start_app")
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    lost = [e for e in c.store.list_events("q") if e.kind == "failure" and "AMQP broker" in e.reason]
    assert lost, "no attempt failed while the broker was down"
    check_keys_once(read_output(out), n)
    check_queue_settled(mq, queue)


def cases(mq: RabbitMQServer) -> dict[str, tuple[str, str, str]]:
    """name -> (url, queue, the line after ``segue: step 'upper': ``)."""
    port, nowhere = mq.port, free_port()
    at = f"amqp://guest:***@127.0.0.1:{port}/%2F"
    return {
        "wrong-password": (mq.url.replace("guest@", "nope@"), "in",
                           f"the AMQP broker at {at} refused the login; check the user and password"),
        "unreachable": (f"amqp://guest:guest@127.0.0.1:{nowhere}/%2F", "in",
                        f"cannot reach the AMQP broker at amqp://guest:***@127.0.0.1:{nowhere}/%2F ("),
        "missing-queue": (mq.url, "no-such-queue",
                          f"queue 'no-such-queue' does not exist at {at}; check the name, or "
                          f"declare it (durable) before the run"),
    }


@pytest.mark.parametrize("case", ["wrong-password", "unreachable", "missing-queue"])
def test_bad_input_is_refused_at_submit_in_one_line(
    segue: Any, mq: RabbitMQServer, tmp_path: Path, case: str
) -> None:
    mq.declare("in")
    url, queue, expected = cases(mq)[case]
    proc = subprocess.run(
        [sys.executable, "-m", "segue", "run", DECLARED, "-p", f"url={url}", "-p",
         f"queue={queue}", "-p", f"out={tmp_path / 'out'}"],
        capture_output=True, text=True, env=segue.env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(f"segue: step 'upper': {expected}"), proc.stderr
    assert "guest:guest" not in proc.stderr and "nope@" not in proc.stderr  # no password shown
    assert not segue.home.exists(), "a refused run must not create the home"
    assert not (tmp_path / "out").exists()


LAG_FLOW = str(Path(__file__).parent / "flows" / "queuelag.py")


@pytest.mark.timeout(300)
def test_status_shows_the_lag_and_a_pause_past_the_stated_ttl_is_warned(
    segue: Any, mq: RabbitMQServer, tmp_path: Path
) -> None:
    """Continuous reading; `segue status` shows the lag the step reported (no broker call of
    its own), and a stop longer than the queue's stated message TTL is warned about in
    status and, at the resume, as a warning event with both figures."""
    s, out, hold, queue = segue, tmp_path / "out", tmp_path / "hold", "lag"
    mq.declare(queue)
    produce(mq, queue, 0, 1000)
    params = {"url": mq.url, "stream": queue, "out": out, "hold": hold, "hold_k": 50,
              "ttl_s": 1, "batch": 50}
    args = [a for k, v in params.items() for a in ("-p", f"{k}={v}")]
    s("run", LAG_FLOW, "--run-id", "q", *args, "--detach", check=True)

    def lag() -> Any:
        return s.step("q", "consume")["queue"]

    try:
        wait_for(lambda: Path(f"{hold}.held-1").exists(), 120, "the step to hold key 50")
        # Reported after the first batch (what had arrived of the prefetch window of 50:
        # delivered, unacked), nothing committed yet: the rest is undelivered.
        q = wait_for(lag, 60, "the step's first lag report", poll=0.25)
        assert 1 <= q["pending"] <= 50 and q["pending"] + q["undelivered"] == 1000, q
        assert q["keeps_s"] == 1.0, q
        line = f"queue: {q['pending']} pending, {q['undelivered']} undelivered"
        assert line in s("status", "q").stdout
        assert s("pause", "q").returncode == 0
        hold.write_text("go")
        wait_for(lambda: s.status("q")["state"] == "PAUSED", 120, "the run to park", poll=0.25)
        assert "message_ttl_s" in lag()["keeps"]  # the words come with the checkpoint
        q = wait_for(lambda: (lag() or {}).get("warning") and lag(), 60,
                     "status to warn of the stop", poll=0.25)
        assert q["stopped_s"] > 1.0 and "longer than the broker keeps" in q["warning"], q
        assert s("resume", "q", "--detach").returncode == 0
        warned = wait_for(lambda: [e["reason"] for e in s.events("q") if e["kind"] == "warning"
                                   and "this step last read from it" in e["reason"]], 120,
                          "the warning event of the resumed step", poll=0.25)
        assert len(warned) == 1 and "keeps unacknowledged messages for 1 s (message_ttl_s" \
            in warned[0], warned
        wait_for(lambda: len(read_output(out)) == 1000, 120, "the rest to be read")
        assert s("pause", "q", "--wait", "--timeout", "120").returncode == 0
    finally:
        hold.write_text("go")
        s("cancel", "q")
    check_keys_once(read_output(out), 1000)
    check_queue_settled(mq, queue)
