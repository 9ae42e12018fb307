"""Input files added while a data step is paused, read with ``--on-input-change include-new``.

The bug this guards: a ``workers=2`` step resumed with include-new counted the
new file's shard as handed out but never put it in its queue, and ended
SUCCEEDED with every record of that file missing. Each variant (1 worker, 2,
elastic 1..2) runs a campaign through the real CLI: files appended at two
pauses, worker and controller SIGKILLs between them (counted when they land),
and the output must hold every record of every file exactly once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import Campaign
from segue_helpers import Segue

FLOW = str(Path(__file__).parent / "flows" / "mapgrow.py")
FAST = {"SEGUE_LEASE_TTL_S": "30", "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
PER_FILE = 6000  # ~40 bytes a record: 6 shards of 40 kB a file


def write_file(d: Path, index: int) -> Path:
    """``in-INDEX.jsonl`` with keys INDEX*PER_FILE.., written under a hidden name and renamed
    into place, as a producer should (a reader never sees half a file)."""
    tmp, final = d / f".in-{index}.tmp", d / f"in-{index}.jsonl"
    with open(tmp, "w") as f:
        for k in range(index * PER_FILE, (index + 1) * PER_FILE):
            f.write(json.dumps({"k": k, "v": f"value-{k:08d}"}) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def published(out: Path) -> list[int]:
    return [json.loads(line)["k"] for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", ["1", "2", "1-2"])
def test_files_added_while_paused_are_read_exactly_once_under_kills(tmp_path: Path, workers: str) -> None:
    inp, out, hold = tmp_path / "in", tmp_path / "out", tmp_path / "hold"
    inp.mkdir()
    write_file(inp, 0)
    # The last record of each file waits for the next file; the last of all for the hold.
    gates = {PER_FILE - 1: inp / "in-1.jsonl", 2 * PER_FILE - 1: inp / "in-2.jsonl", 3 * PER_FILE - 1: hold}
    s = Segue(tmp_path / "home")
    s.env.update(FAST)
    s.env.update({"MAPGROW_WORKERS": workers, "MAPGROW_HOLD": str(hold),
                  "MAPGROW_GATES": ",".join(f"{k}:{p}" for k, p in gates.items())})
    s("run", FLOW, "--run-id", "grow", "-p", f"input={inp}", "-p", f"out={out}",
      "--on-input-change", "include-new", "--pause-deadline", "3", "--detach", check=True)
    c = Campaign(s, "grow", hold, timeout=480)
    try:
        for fault in ("kill_worker", "pause"):
            c.fire(fault, 1)
        write_file(inp, 1)  # while PAUSED: the next resume (the campaign's) must include it
        for fault in ("kill_worker", "kill_controller", "kill_worker", "pause"):
            c.fire(fault, 1)
        write_file(inp, 2)
        for fault in ("kill_worker", "kill_controller", "kill_worker"):
            c.fire(fault, 1)
        c.finish()
    finally:
        hold.write_text("go")
        s("cancel", "grow")
    assert dict(c.landed) == {"kill_worker": 5, "kill_controller": 2, "pause": 2}, c.log
    keys = published(out)
    n = 3 * PER_FILE
    assert len(keys) == n and sorted(keys) == list(range(n)), (
        f"{n - len(set(keys))} lost, {len(keys) - len(set(keys))} duplicated")
    stats: dict[str, Any] = s.output("grow", "grow")
    assert stats["records_in"] == n and stats["records_out"] == n, stats
    assert stats["bytes_in"] == sum(p.stat().st_size for p in inp.glob("in-*.jsonl")), stats
    if workers == "1-2":  # the elastic path really ran: it grew past its minimum
        assert any(e["kind"] == "scale" and e["data"]["direction"] == "up" for e in s.events("grow"))
