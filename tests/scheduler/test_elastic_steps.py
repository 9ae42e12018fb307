"""Elastic map steps (``workers=(min, max)``): autoscaling and partial preemption.

Real controllers, coordinators and sub-worker processes on a pool of virtual
GPUs. The batch run's records are slow while a file exists (a lower bound on
how long it lasts, never a block: sub-workers keep answering barriers), so
the test decides when it may finish. Every claim is checked on what happened:
the scale events, the devices each output row was computed on, the urgent
run's placement, and the output, exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from segue_helpers import FLOWS, Segue, wait_for

ELASTIC = str(FLOWS / "elastic.py")
GPUJOB = str(FLOWS / "gpujob.py")
# At 5 ms a record and 3 sub-workers, at least 60 s while the slow file exists; a
# sub-worker's batch of 512 (and so a barrier, where the step shrinks) takes 2.5 s.
N = 36000


def scale_events(segue: Segue, run: str) -> list[dict[str, Any]]:
    return [e for e in segue.events(run) if e["kind"] == "scale"]


def live_workers(segue: Segue, run: str, attempt: int | None = None) -> int:
    """Sub-workers now, by the scale events (of ``attempt`` only, when given)."""
    events = segue.events(run)
    if attempt is not None:
        starts = [e["id"] for e in events if e["kind"] == "task"
                  and e["reason"].startswith(f"attempt {attempt} started")]
        if not starts:
            return 0
        events = [e for e in events if e["id"] > starts[-1]]
    ev = [e for e in events if e["kind"] == "scale"]
    return ev[-1]["data"]["workers"] if ev else 1


def outputs(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(out.glob("*.jsonl")) for line in p.read_text().splitlines()]


def check_exactly_once(out: Path, n: int) -> list[dict[str, Any]]:
    rows = outputs(out)
    assert sorted(r["k"] for r in rows) == list(range(n))  # nothing lost, nothing twice
    assert all(r["v"] == r["k"] * r["k"] for r in rows)
    return rows


def test_elastic_step_gives_up_one_device_to_an_urgent_run_and_grows_back(
        segue: Segue, tmp_path: Path) -> None:
    assert segue("pool", "set", "--gpus", "3", "--gpu-mem", "80GB", "--cpus", "8").returncode == 0
    slow, out = tmp_path / "slow", tmp_path / "out"
    slow.touch()
    env = {"ELASTIC_SLOW_FILE": str(slow), "ELASTIC_DELAY": "0.005"}
    segue("run", ELASTIC, "--detach", "--run-id", "low", "--priority", "batch", "-p", f"n={N}",
          "-p", f"out={out}", env=env, check=True)
    wait_for(lambda: live_workers(segue, "low") == 3, 180, "the batch run to grow to 3 sub-workers")
    # Gate on progress, not on the scale event: a sub-worker counts once it
    # started; it may not have committed a row yet (a loaded machine takes
    # seconds to start one), and the urgent run may take exactly its device.
    wait_for(lambda: {r["dev"] for r in outputs(out)} == {"0", "1", "2"}, 180,
             "committed rows from all 3 sub-workers")

    segue("run", GPUJOB, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=40",
          check=True)
    segue.wait_state("hi", {"SUCCEEDED"}, 180)
    # The batch run went on the whole time on its other sub-workers.
    assert segue.status("low")["state"] == "RUNNING"
    wait_for(lambda: live_workers(segue, "low") == 3, 180, "the batch run to grow back to 3")
    slow.unlink()
    segue.wait_state("low", {"SUCCEEDED"}, 300)

    low = segue.events("low")
    # Never paused: no run transition through PAUSING or PAUSED.
    assert {e["to_state"] for e in low if e["kind"] == "run"} == {"PENDING", "RUNNING", "SUCCEEDED"}
    gave = [e for e in low if e["kind"] == "scheduler" and e["data"].get("partial")]
    assert len(gave) == 1, gave
    promised = gave[0]["data"]["devices"]
    assert len(promised) == 1 and "preempted by run 'hi' (urgent)" in gave[0]["reason"]
    scales = scale_events(segue, "low")
    downs = [e for e in scales if e["data"]["direction"] == "down" and "partial" in e["reason"]]
    assert len(downs) == 1 and downs[0]["data"]["devices"] == promised, scales
    i = scales.index(downs[0])
    # It shrank to 2, then (once the urgent run was done) grew back to 3.
    assert downs[0]["data"]["workers"] == 2
    assert any(e["data"]["direction"] == "up" and e["data"]["workers"] == 3 for e in scales[i + 1:])
    # The urgent run ran on exactly the device the batch run gave back.
    hi_out = segue.output("hi", "work")
    assert {s["devices"] for s in hi_out["seen"]} == {str(promised[0])}
    hi_sched = [e["reason"] for e in segue.events("hi") if e["kind"] == "scheduler"]
    assert any("partial: it keeps running" in r for r in hi_sched), hi_sched

    rows = check_exactly_once(out, N)
    # Each sub-worker saw exactly one device of its own.
    assert {r["dev"] for r in rows} == {"0", "1", "2"}
    status = segue.status("low")
    assert status["state"] == "SUCCEEDED"
    acct = status["accounting"]
    assert acct["preemptions"] == 0  # partial preemptions do not pause the run
    assert acct["partial_preemptions"] == 1
    assert acct["scale_ups"] == len([e for e in scales if e["data"]["direction"] == "up"]) >= 3
    assert acct["scale_downs"] == len(scales) - acct["scale_ups"] >= 1
    assert acct["device_seconds"] > 0


def test_elastic_cpu_step_grows_with_its_backlog_and_retires_idle_sub_workers(
        segue: Segue, tmp_path: Path) -> None:
    slow, out = tmp_path / "slow", tmp_path / "out"
    slow.touch()
    env = {"ELASTIC_SLOW_FILE": str(slow), "ELASTIC_DELAY": "0.01"}
    segue("run", ELASTIC, "--detach", "--run-id", "cpu", "--gpus", "0", "-p", "n=4000",
          "-p", "shards=6", "-p", f"out={out}", env=env, check=True)
    wait_for(lambda: live_workers(segue, "cpu") == 3, 180, "the step to grow to 3 sub-workers")
    slow.unlink()
    segue.wait_state("cpu", {"SUCCEEDED"}, 300)
    scales = scale_events(segue, "cpu")
    ups = [e for e in scales if e["data"]["direction"] == "up"]
    assert [e["data"]["workers"] for e in ups[:2]] == [2, 3]
    assert all(e["data"]["devices"] == [] for e in scales)  # a CPU step holds no devices
    rows = check_exactly_once(out, 4000)
    assert {r["dev"] for r in rows} == {""}


def test_elastic_step_killed_and_paused_at_full_size_resumes_exactly_once(
        segue: Segue, tmp_path: Path) -> None:
    """A restart begins with ``min`` sub-workers while the checkpoint holds work in
    every slot: the vacant slots' shards are taken over where they stopped."""
    import os
    import signal

    slow, out = tmp_path / "slow", tmp_path / "out"
    slow.touch()
    env = {"ELASTIC_SLOW_FILE": str(slow), "ELASTIC_DELAY": "0.01"}
    segue("run", ELASTIC, "--detach", "--run-id", "k", "--gpus", "0", "-p", "n=6000",
          "-p", "shards=6", "-p", f"out={out}", env=env, check=True)
    kills = 0
    for attempt in (1, 2):
        # The retry starts with one sub-worker, whatever its checkpoint holds, and grows.
        wait_for(lambda: live_workers(segue, "k", attempt) == 3, 180, f"attempt {attempt} at 3")
        checkpoints = [e for e in segue.events("k") if e["kind"] == "checkpoint"]
        wait_for(lambda: len([e for e in segue.events("k") if e["kind"] == "checkpoint"])
                 > len(checkpoints), 120, "a checkpoint at full size")
        pid = segue.step("k", "square")["pid"]
        os.kill(pid, signal.SIGKILL)
        kills += 1
        wait_for(lambda: segue.step("k", "square")["attempts"] == attempt + 1, 120, "the retry")
    assert segue("pause", "k").returncode == 0
    segue.wait_state("k", {"PAUSED"}, 120)
    slow.unlink()
    assert segue("resume", "k", "--detach").returncode == 0
    segue.wait_state("k", {"SUCCEEDED"}, 300)
    assert kills == 2
    task = segue.step("k", "square")
    assert task["attempts"] == 4  # two kills, one pause, each resumed
    check_exactly_once(out, 6000)
