"""`segue status` shows a Redis stream step's lag, and a pause past what the stream keeps is
a warning with the figures, never a silent loss: through the CLI, against a real redis-server.

The step reads continuously (no drain rule). Every wait is on something observed
(a held message's marker file, the status document, the output), never a sleep.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from brokerkit import RedisServer, redis_skip_reason, serve  # noqa: E402
from segue_helpers import wait_for  # noqa: E402

FLOW = str(Path(__file__).parent / "flows" / "queuelag.py")
GROUP = "segue-consume"


@pytest.fixture()
def redis_server(tmp_path: Path) -> Any:
    yield from serve(RedisServer.start, redis_skip_reason(), tmp_path / "redis")


def produce(r: Any, stream: str, n: int) -> None:
    pipe = r.pipeline()
    for k in range(n):
        pipe.xadd(stream, {"data": json.dumps({"k": k, "v": f"value-{k:08d}"})})
    pipe.execute()


def keys(out: Path) -> list[int]:
    return [json.loads(line)["k"] for p in sorted(out.glob("part-*.jsonl"))
            for line in p.read_text().splitlines()]


def queue_of(s: Any) -> dict[str, Any] | None:
    return s.step("q", "consume")["queue"]


@pytest.mark.timeout(300)
def test_status_shows_the_lag_and_a_trimmed_pause_is_warned_with_the_figures(
    segue: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    s, r, out, hold = segue, redis_server.client(), tmp_path / "out", tmp_path / "hold"
    produce(r, "in", 1000)
    s("run", FLOW, "--run-id", "q", "-p", f"url={redis_server.url}", "-p", "stream=in",
      "-p", f"out={out}", "-p", f"hold={hold}", "-p", "hold_k=50", "-p", "retention_s=1",
      "--detach", check=True)
    try:
        # The first batch (keys 0-49) is read and its lag reported; key 50 waits.
        wait_for(lambda: Path(f"{hold}.held-1").exists(), 120, "the step to hold key 50")
        q = wait_for(lambda: queue_of(s), 60, "the step's first lag report in `segue status`", poll=0.25)
        assert q["pending"] == 50 and q["undelivered"] == 950, q
        assert q["oldest_age_s"] is not None and q["oldest_age_s"] >= 0
        assert q["keeps_s"] == 1.0 and "1.0 s" in q["keeps"], q
        text = s("status", "q").stdout
        assert "queue: 50 pending, 950 undelivered, oldest" in text, text

        # Pause: the held batch commits, is published and acked, and the step parks.
        assert s("pause", "q").returncode == 0
        hold.write_text("go")
        wait_for(lambda: s.status("q")["state"] == "PAUSED", 120, "the run to park", poll=0.25)
        assert int(r.xpending("in", GROUP)["pending"]) == 0
        assert sorted(keys(out)) == list(range(100))
        # Stopped longer than the stated retention: status warns with both figures.
        q = wait_for(lambda: (queue_of(s) or {}).get("warning") and queue_of(s), 60,
                     "status to warn of the stop", poll=0.25)
        assert q["stopped_s"] > 1.0 and "longer than the broker keeps" in q["warning"], q
        assert "WARNING: stopped for" in s("status", "q").stdout

        # A producer's trimming deletes entries 0-699 meanwhile: 600 were never read.
        assert r.xtrim("in", maxlen=300, approximate=False) == 700
        assert s("resume", "q", "--detach").returncode == 0
        wait_for(lambda: len(keys(out)) == 400, 120, "the resumed step to read what is left")
        warnings = wait_for(
            lambda: [e["reason"] for e in s.events("q") if e["kind"] == "warning"
                     and "consume" in e["reason"]] or None, 60, "the warning events", poll=0.25)
        lost = [w for w in warnings if "trimmed past what group" in w]
        assert len(lost) == 1 and "600 entries were deleted before this step read them" in lost[0], \
            warnings
        stale = [w for w in warnings if "this step last read from it" in w]
        assert len(stale) == 1 and "keeps entries for 1 s (retention_s)" in stale[0], warnings
        assert s("pause", "q", "--wait", "--timeout", "120").returncode == 0
    finally:
        hold.write_text("go")
        s("cancel", "q")
    # What was not lost was published exactly once and acked.
    assert sorted(keys(out)) == [*range(100), *range(700, 1000)]
    assert int(r.xpending("in", GROUP)["pending"]) == 0
    info = next(g for g in r.xinfo_groups("in") if g["name"] == GROUP)
    assert info["last-delivered-id"] == r.xrevrange("in", count=1)[0][0]
