"""A Pub/Sub subscription through a map step under real SIGKILLs, a pause with a producer going
on, and bad input, via the CLI, against gcloud's real Pub/Sub emulator.

Every fault is gated on observed progress (a new committed checkpoint of the
running attempt, tests/campaign_kit.py) and counted when it lands. One kill is
aimed exactly between the sink's commit and the ack by the ``queue.before_ack``
fault point, armed for the first attempt only: the redelivered messages must be
dropped by the ledger, not published again. A killed worker gives nothing back:
its messages return when their ack deadline (10 s here) lapses, and the next
attempt waits that out before it may call the subscription drained. At the end
every message's output is published exactly once (the set a clean run
publishes: each key once, its value transformed), and once every deadline has
passed a pull finds nothing (so nothing is left unacked).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import Campaign

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import free_port  # noqa: E402
from pubsubkit import PubSubEmulator, pubsub_skip_reason  # noqa: E402
from segue_helpers import wait_for  # noqa: E402

FLOW = str(Path(__file__).parent / "flows" / "pubsubflow.py")
DECLARED = str(Path(__file__).parent / "flows" / "pubsubdecor.py")
FAST = {
    "SEGUE_LEASE_TTL_S": "30",
    "SEGUE_BACKOFF_BASE_S": "0.01",
    "SEGUE_BACKOFF_MAX_S": "0.05",
    "SEGUE_PAUSE_DEADLINE_S": "20",
}
DEADLINE = 10  # the subscription's ack deadline: what a killed worker's messages wait
CAMPAIGN_N = int(os.environ.get("SEGUE_PUBSUB_CAMPAIGN_N", "6000"))
PAUSED_EXTRA = 500  # published while the run is paused
KILLS = 8  # every 4th one of the controller; one more lands at queue.before_ack


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


def produce(ps: PubSubEmulator, topic: str, first: int, n: int) -> None:
    ps.publish(topic, [json.dumps({"k": k, "v": f"value-{k:08d}"}) for k in range(first, first + n)])


def read_output(out: Path) -> list[tuple[int, str]]:
    rows = []
    for p in sorted(out.glob("part-*.jsonl")):
        rows.extend((r["k"], r["v"]) for r in map(json.loads, p.read_text().splitlines()))
    return rows


def check_exactly_once(got: list[tuple[int, str]], n: int) -> None:
    counts = Counter(k for k, _ in got)
    dupes = [k for k, c in counts.items() if c > 1]
    lost = set(range(n)) - set(counts)
    assert not dupes and not lost, f"{len(dupes)} duplicated (e.g. {dupes[:5]}), {len(lost)} lost"
    # What a clean run publishes: every key once, its value transformed.
    assert sorted(got) == [(k, f"VALUE-{k:08d}") for k in range(n)]


@pytest.mark.timeout(900)
def test_sigkill_campaign_with_a_paused_producer_exactly_once(
    segue: Any, ps: PubSubEmulator, tmp_path: Path
) -> None:
    s, out, hold = segue, tmp_path / "out", tmp_path / "hold"
    s.env.update(FAST)
    # A dead-letter policy: Pub/Sub counts deliveries (far above what the kills cause).
    sub = ps.create("campaign", "campaign", ack_deadline_s=DEADLINE, dead_letter_max=100)
    produce(ps, "campaign", 0, CAMPAIGN_N)
    total = CAMPAIGN_N + PAUSED_EXTRA
    t0 = time.monotonic()
    out.mkdir()
    params = {"emulator": ps.host, "subscription": sub, "out": out, "sleep_ms": 1,
              "hold": hold, "hold_k": CAMPAIGN_N - 1}
    args = [a for k, v in params.items() for a in ("-p", f"{k}={v}")]
    # The first attempt SIGKILLs itself right after its third commit and publish, before the ack.
    s("run", FLOW, "--run-id", "q", *args, "--detach", check=True, env={
        "SEGUE_FAULTS": "queue.before_ack:kill:3", "SEGUE_FAULTS_IN": "worker",
        "SEGUE_FAULTS_EPOCHS": "1"})
    c = Campaign(s, "q", hold, timeout=800)
    rng = random.Random(39)
    try:
        wait_for(lambda: c._task().epoch >= 2, 120, "the first attempt to die at queue.before_ack")
        first = [ck for ck in c.store.list_checkpoints("q", "consume") if ck.epoch == 1]
        assert len(first) == 3, first  # it died after its third commit: between commit and ack
        wait_for(lambda: c.recorded_worker_sigkills() >= 1, 60, "the store to record the SIGKILL")
        c.landed["kill_before_ack"] += 1
        plan = ["kill_controller" if (i + 1) % 4 == 0 else "kill_worker" for i in range(KILLS)]
        plan.insert(1, "pause")
        for action in plan:
            c.fire(action, rng.randint(1, 2))
            if action == "pause":
                produce(ps, "campaign", CAMPAIGN_N, PAUSED_EXTRA)  # a producer goes on meanwhile
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "q")
    seconds = time.monotonic() - t0
    kills = {k: v for k, v in c.landed.items() if k != "pause"}
    assert c.landed["pause"] == 1 and sum(kills.values()) == KILLS + 1, c.log
    assert kills["kill_controller"] == KILLS // 4, c.log
    assert c.recorded_worker_sigkills() >= c.landed["kill_worker"] - KILLS // 4, c.log
    check_exactly_once(read_output(out), total)
    assert ps.leftover("campaign", DEADLINE + 1) == 0  # every message was acknowledged
    print(f"pubsub campaign: {total} messages, landed {dict(c.landed)} "
          f"({sum(kills.values())} SIGKILLs), missed {dict(c.missed)}, {seconds:.0f}s")


def cases(ps: PubSubEmulator) -> dict[str, tuple[str, str, str]]:
    """name -> (emulator, subscription, the line after ``segue: step 'upper': ``)."""
    nowhere = f"127.0.0.1:{free_port()}"
    missing = ps.sub_path("no-such-sub")
    return {
        "unreachable": (nowhere, ps.sub_path("in"),
                        f"cannot reach the Pub/Sub emulator at {nowhere} ("),
        "missing-subscription": (ps.host, missing,
                                 f"subscription {missing!r} does not exist at the Pub/Sub emulator "
                                 f"at {ps.host}; check the name, or create it before the run"),
        "bad-name": (ps.host, "in",
                     "subscription 'in' needs project= (or give its full path)"),
    }


@pytest.mark.parametrize("case", ["unreachable", "missing-subscription", "bad-name"])
def test_bad_input_is_refused_at_submit_in_one_line(
    segue: Any, ps: PubSubEmulator, tmp_path: Path, case: str
) -> None:
    emulator, sub, expected = cases(ps)[case]
    proc = subprocess.run(
        [sys.executable, "-m", "segue", "run", DECLARED, "-p", f"emulator={emulator}", "-p",
         f"subscription={sub}", "-p", f"out={tmp_path / 'out'}"],
        capture_output=True, text=True, env=segue.env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"segue: step 'upper': {expected}"), proc.stderr
    assert not segue.home.exists(), "a refused run must not create the home"
    assert not (tmp_path / "out").exists()
