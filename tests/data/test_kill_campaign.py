"""Exactly once under real SIGKILLs (workers and controller) and pause/resume, via the CLI.

CI runs a 100k-record campaign with 20 landed SIGKILLs for the JSONL and SQL
sinks and a reduced one for the others; the 1M-record, 50-kill campaign over
every sink is marked slow (``pytest -m slow``). Every campaign asserts the
faults that *landed* (see :class:`Campaign`), not the ones it meant to inject.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from campaign_kit import assert_landed, campaign

FLOW = str(Path(__file__).parent / "flows" / "mapflow.py")
# A long lease: the campaign's faults are SIGKILLs, seen at once by their exit; a short
# lease would only add "lease expired" kills of workers that start slowly on a loaded box.
FAST = {"SEGUE_LEASE_TTL_S": "30", "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05",
        "SEGUE_PAUSE_DEADLINE_S": "20"}
SINKS = ["jsonl", "parquet", "sqlite", "external"]


def make_input(d: Path, n: int, files: int = 4) -> str:
    d.mkdir(parents=True, exist_ok=True)
    handles = [open(d / f"in-{i}.jsonl", "w") for i in range(files)]
    for k in range(n):
        handles[k % files].write(json.dumps({"k": k, "v": f"value-{k:08d}"}) + "\n")
    for h in handles:
        h.close()
    return str(d / "in-*.jsonl")


def read_output(kind: str, out: Path) -> list[tuple[int, str]]:
    if kind == "jsonl":
        rows = []
        for p in sorted(out.glob("part-*.jsonl")):
            with open(p) as f:
                rows.extend((r["k"], r["v"]) for r in map(json.loads, f))
        return rows
    if kind == "parquet":
        import pyarrow.parquet as pq

        return [(r["k"], r["v"]) for p in sorted(out.glob("part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    if kind == "sqlite":
        with sqlite3.connect(out / "out.db") as c:
            return c.execute("SELECT k, v FROM results").fetchall()
    with sqlite3.connect(out / "receiver.db") as c:
        return [(b["k"], b["v"]) for b in (json.loads(x) for (x,) in c.execute("SELECT body FROM got"))]


def start(s: Any, run_id: str, inp: str, out: Path, kind: str, sleep_every: int, shard_bytes: int,
          hold: Path, n: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"out={out}", "-p", f"sink={kind}",
      "-p", f"sleep_every={sleep_every}", "-p", f"shard_bytes={shard_bytes}",
      "-p", f"hold={hold}", "-p", f"hold_k={n - 1}", "--detach", check=True)


def check_exactly_once(got: list[tuple[int, str]], n: int, clean: list[tuple[int, str]] | None = None) -> None:
    counts = Counter(k for k, _ in got)
    dupes = [k for k, c in counts.items() if c > 1]
    lost = set(range(n)) - set(counts)
    assert not dupes and not lost, f"{len(dupes)} duplicated (e.g. {dupes[:5]}), {len(lost)} lost"
    assert sorted(got) == sorted(clean) if clean is not None else True
    assert all(v == f"VALUE-{k:08d}" for k, v in got)


def run_campaign(segue_cls: type, tmp_path: Path, kind: str, n: int, kills: int, pauses: int, seed: int,
                 sleep_every: int, shard_bytes: int, with_clean: bool, timeout: float = 840,
                 ) -> dict[str, Any]:
    s = segue_cls(tmp_path / "home")
    s.env.update(FAST)
    inp = make_input(tmp_path / "in", n)
    clean = None
    if with_clean:
        cs = segue_cls(tmp_path / "clean-home")
        cs.env.update(FAST)
        out = tmp_path / "clean-out"
        out.mkdir()
        proc = cs("run", FLOW, "--run-id", "clean", "-p", f"input={inp}", "-p", f"out={out}", "-p",
                  f"sink={kind}", "-p", f"shard_bytes={shard_bytes}", timeout=600)
        assert proc.returncode == 0, proc.stderr
        clean = read_output(kind, out)
    out = tmp_path / "out"
    hold = tmp_path / "hold"
    start(s, "faulty", inp, out, kind, sleep_every, shard_bytes, hold, n)
    try:
        done = campaign(s, "faulty", hold, seed, kills, pauses, timeout=timeout)
    finally:
        # A failed campaign must not leave a held run (controller and worker) behind.
        hold.write_text("go")
        s("cancel", "faulty")
    got = read_output(kind, out)
    check_exactly_once(got, n, clean)
    if kind == "external":
        with sqlite3.connect(out / "receiver.db") as c:
            done["resent_same_key"] = c.execute("SELECT coalesce(sum(n - 1), 0) FROM got").fetchone()[0]
    print(f"campaign {kind} n={n}: {done}")  # shown with -s or -rP: the figures for the record
    return done


@pytest.mark.parametrize("kind", ["jsonl", "sqlite"])
@pytest.mark.timeout(900)
def test_ci_kill_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    """The campaign CI runs: 100k records, 20 landed SIGKILLs (15 workers, 5 controllers), 2 pauses."""
    done = run_campaign(type(segue), tmp_path, kind, n=100_000, kills=20, pauses=2,
                        seed=10 + ["jsonl", "sqlite"].index(kind), sleep_every=20,
                        shard_bytes=400_000, with_clean=kind == "jsonl")
    assert_landed(done, kills=20, pauses=2)


@pytest.mark.parametrize("kind", ["parquet", "external"])
@pytest.mark.timeout(900)
def test_reduced_kill_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=10_000, kills=5, pauses=2, seed=SINKS.index(kind) + 1,
                        sleep_every=2, shard_bytes=60_000, with_clean=False)
    assert_landed(done, kills=5, pauses=2)


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("kind", SINKS)
def test_million_record_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=1_000_000, kills=50, pauses=6, seed=100 + SINKS.index(kind),
                        sleep_every=20, shard_bytes=4_000_000, with_clean=True, timeout=3300)
    assert_landed(done, kills=50, pauses=6)
