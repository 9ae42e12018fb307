"""Exactly once under real SIGKILLs (workers and controller) and pause/resume, via the CLI.

The default suite runs a reduced campaign per sink kind; the 1M-record,
50-kill campaign is marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

FLOW = str(Path(__file__).parent / "flows" / "mapflow.py")
FAST = {"SEGUE_LEASE_TTL_S": "1", "SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05",
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


def start(s: Any, run_id: str, inp: str, out: Path, kind: str, sleep_every: int, shard_bytes: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    s("run", FLOW, "--run-id", run_id, "-p", f"input={inp}", "-p", f"out={out}", "-p", f"sink={kind}",
      "-p", f"sleep_every={sleep_every}", "-p", f"shard_bytes={shard_bytes}", "--detach", check=True)


def campaign(s: Any, run_id: str, seed: int, kills: int, pauses: int, controller_every: int = 4,
             timeout: float = 600) -> dict[str, int]:
    """Inject faults at random moments until the budget is spent, then let the run finish."""
    rng = random.Random(seed)
    done: Counter[Any] = Counter()
    plan = ["kill"] * kills + ["pause"] * pauses
    rng.shuffle(plan)
    deadline = time.monotonic() + timeout
    for action in plan:
        time.sleep(rng.uniform(0.05, 0.5))
        st = s.status(run_id)
        if st["state"] == "SUCCEEDED":
            break
        if action == "kill" and (done["kill"] + 1) % controller_every == 0:
            pid = st["controller"]["pid"]
            if st["controller"]["alive"] and pid:
                _kill(pid)
                done["kill_controller"] += 1
        elif action == "kill":
            pid = _wait(lambda: _worker_pid(s, run_id), 15)
            if pid and pid > 0:
                _kill(pid)
                done["kill_worker"] += 1
            else:  # no worker for 15s (between attempts): note it, make sure the run is driven
                done["no_worker"] += 1
                done.setdefault("no_worker_states", []).append(s.status(run_id)["steps"][0]["state"])
        else:
            proc = s("pause", run_id, "--wait", "--timeout", "60")
            if proc.returncode not in (0, 3):
                # The only acceptable refusal: the run finished in the meantime.
                assert s.status(run_id)["state"] == "SUCCEEDED", proc.stderr
                break
            done["pause"] += 1
        done["kill"] += action == "kill"
        _ensure_driven(s, run_id)
        assert time.monotonic() < deadline, "campaign took too long"
    while True:
        st = s.status(run_id)
        if st["state"] == "SUCCEEDED":
            return dict(done)
        assert st["state"] != "FAILED", st
        _ensure_driven(s, run_id)
        assert time.monotonic() < deadline, f"run did not finish: {st}"
        time.sleep(0.1)


def _wait(pred: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.02)
    return 0


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _worker_pid(s: Any, run_id: str) -> int:
    st = s.status(run_id)
    if st["state"] in ("SUCCEEDED", "FAILED", "PAUSED"):
        return -1
    step = st["steps"][0]
    return step["pid"] or 0


def _ensure_driven(s: Any, run_id: str) -> None:
    """Resume a paused run, or one whose controller was killed."""
    for _ in range(100):
        st = s.status(run_id)
        if st["state"] in ("SUCCEEDED", "FAILED"):
            return
        if st["state"] == "PAUSING" and not st["controller"]["alive"]:
            s("pause", run_id, "--wait", "--timeout", "30")
            continue
        if st["state"] in ("RUNNING", "PAUSING") and st["controller"]["alive"]:
            return
        proc = s("resume", run_id, "--detach")
        if proc.returncode == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not resume {run_id}: {s.status(run_id)}")


def check_exactly_once(got: list[tuple[int, str]], n: int, clean: list[tuple[int, str]] | None = None) -> None:
    counts = Counter(k for k, _ in got)
    dupes = [k for k, c in counts.items() if c > 1]
    lost = set(range(n)) - set(counts)
    assert not dupes and not lost, f"{len(dupes)} duplicated (e.g. {dupes[:5]}), {len(lost)} lost"
    assert sorted(got) == sorted(clean) if clean is not None else True
    assert all(v == f"VALUE-{k:08d}" for k, v in got)


def run_campaign(segue_cls: type, tmp_path: Path, kind: str, n: int, kills: int, pauses: int, seed: int,
                 sleep_every: int, shard_bytes: int, with_clean: bool) -> dict[str, Any]:
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
    start(s, "faulty", inp, out, kind, sleep_every, shard_bytes)
    done = campaign(s, "faulty", seed, kills, pauses)
    got = read_output(kind, out)
    check_exactly_once(got, n, clean)
    if kind == "external":
        with sqlite3.connect(out / "receiver.db") as c:
            done["resent_same_key"] = c.execute("SELECT coalesce(sum(n - 1), 0) FROM got").fetchone()[0]
    return done


@pytest.mark.parametrize("kind", SINKS)
def test_reduced_kill_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=10_000, kills=5, pauses=2, seed=SINKS.index(kind) + 1,
                        sleep_every=5, shard_bytes=60_000, with_clean=kind == "jsonl")
    assert done.get("kill_worker", 0) + done.get("kill_controller", 0) + done.get("pause", 0) >= 3, done


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("kind", SINKS)
def test_million_record_campaign(segue: Any, tmp_path: Path, kind: str) -> None:
    done = run_campaign(type(segue), tmp_path, kind, n=1_000_000, kills=50, pauses=6, seed=100 + SINKS.index(kind),
                        sleep_every=20, shard_bytes=4_000_000, with_clean=True)
    assert done.get("kill_worker", 0) + done.get("kill_controller", 0) >= 50, done
