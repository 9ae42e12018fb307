"""Priority scheduling with checkpoint-aware preemption, on virtual GPUs.

Real controllers and workers, real signals; the pool has virtual devices so
no GPU is needed. Each test checks the outputs are exactly right.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, flow_module, wait_for

GPUJOB = str(FLOWS / "gpujob.py")
expected_acc = flow_module("gpujob").expected_acc


def setup_pool(segue: Segue, gpus: int) -> None:
    proc = segue("pool", "set", "--gpus", str(gpus), "--gpu-mem", "80GB", "--cpus", "8")
    assert proc.returncode == 0, proc.stderr


def start(segue: Segue, run: str, priority: str, n: int, *extra: str, env: dict | None = None,
          gate: Path | None = None) -> None:
    """Start a gpujob run; with ``gate`` it holds half-way until the test opens it, so
    no outcome depends on how fast this machine is."""
    more = ("-p", f"gate={gate}") if gate is not None else ()
    segue("run", GPUJOB, "--detach", "--run-id", run, "--priority", priority, "-p", f"n={n}",
          *more, *extra, env=env, check=True)


def gates(tmp: Path, *names: str) -> dict[str, Path]:
    return {n: tmp / f"gate-{n}" for n in names}


def work(segue: Segue, run: str) -> dict[str, Any]:
    return segue.step(run, "work")


def running(segue: Segue, run: str) -> bool:
    s = work(segue, run)
    return s["state"] == "RUNNING" and bool(s["pid"])


def progressed(segue: Segue, run: str, at_least: float) -> bool:
    return (work(segue, run)["progress"]["done"] or 0) >= at_least


def check_output(segue: Segue, run: str, n: int) -> dict[str, Any]:
    out = segue.output(run, "work")
    assert out["i"] == n
    assert out["acc"] == expected_acc(n)  # bit-exact: nothing lost or repeated
    return out


def test_urgent_run_preempts_batch_which_resumes_by_itself(segue: Segue, tmp_path: Path) -> None:
    g = gates(tmp_path, "low", "hi")
    setup_pool(segue, 1)
    start(segue, "low", "batch", 800, gate=g["low"])
    wait_for(lambda: running(segue, "low") and progressed(segue, "low", 30), 120, "low to run")
    start(segue, "hi", "urgent", 60, gate=g["hi"])
    wait_for(lambda: running(segue, "hi"), 120, "the urgent run to get the device")
    # (how fast is measured by benchmarks.preemption, not here: this box may be loaded)
    segue.wait_state("low", {"PAUSED"}, 60)
    assert work(segue, "low")["pid"] is None
    # While the urgent run holds the device, the batch run stays paused.
    time.sleep(0.3)
    assert segue.status("low")["state"] == "PAUSED"
    g["hi"].touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    g["low"].touch()
    segue.wait_state("low", {"SUCCEEDED"}, 120)
    check_output(segue, "hi", 60)
    out = check_output(segue, "low", 800)
    assert all(s["devices"] == "0" for s in out["seen"])  # each attempt saw exactly its device
    hi_events = [e["reason"] for e in segue.events("hi") if e["kind"] == "scheduler"]
    assert any(r.startswith("preempting low (batch") for r in hi_events), hi_events
    low_events = segue.events("low")
    assert any("preempted by run 'hi' (urgent)" in e["reason"] for e in low_events)
    assert any("resuming after preemption" in e["reason"] for e in low_events)
    acct = segue.status("low")["accounting"]
    assert acct["preemptions"] == 1 and acct["paused_seconds"] > 0
    assert acct["device_seconds"] > 0 and acct["checkpoint_bytes"] > 0
    assert acct["device_seconds_saved_by_resume"] > 0
    assert acct["work_redone_seconds"] == 0  # it parked at a pause point: nothing to redo


def test_two_victims_for_a_two_gpu_run(segue: Segue, tmp_path: Path) -> None:
    g = gates(tmp_path, "b1", "b2", "big")
    setup_pool(segue, 2)
    start(segue, "b1", "batch", 800, gate=g["b1"])
    start(segue, "b2", "batch", 800, gate=g["b2"])
    wait_for(lambda: running(segue, "b1") and running(segue, "b2"), 120, "both batch runs")
    start(segue, "big", "urgent", 40, "--gpus", "2", gate=g["big"])
    wait_for(lambda: running(segue, "big"), 120, "the two-gpu run")
    assert {segue.status("b1")["state"], segue.status("b2")["state"]} == {"PAUSED"}
    for gate in g.values():
        gate.touch()
    for r in ("big", "b1", "b2"):
        segue.wait_state(r, {"SUCCEEDED"}, 120)
    out = check_output(segue, "big", 40)
    assert out["seen"][0]["devices"] == "0,1"
    # The victims held one device each, different ones, and together exactly
    # the two the urgent run then got: it took both victims' devices.
    victims = [check_output(segue, r, 800)["seen"][0]["devices"] for r in ("b1", "b2")]
    assert sorted(victims) == ["0", "1"], victims


def test_victim_that_ignores_the_pause_is_killed_and_stays_correct(segue: Segue, tmp_path: Path
                                                                   ) -> None:
    g = gates(tmp_path, "stubborn")
    setup_pool(segue, 1)
    ready = tmp_path / "ready"
    start(segue, "stubborn", "batch", 800, "-p", "ignore_pause=true", "-p", f"ready={ready}",
          env={"SEGUE_PAUSE_DEADLINE_S": "0.5"}, gate=g["stubborn"])
    # Once `ready` exists the step has its checkpoint and never reaches a pause point again.
    wait_for(ready.exists, 120, "the stubborn step's checkpoint")
    start(segue, "hi", "urgent", 30)
    wait_for(lambda: segue.status("hi")["state"] == "SUCCEEDED" or running(segue, "hi"), 120,
             "urgent run")
    events = segue.events("stubborn")
    assert any("killed at the pause deadline" in e["reason"] for e in events), events
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    g["stubborn"].touch()
    segue.wait_state("stubborn", {"SUCCEEDED"}, 120)
    check_output(segue, "stubborn", 800)
    assert segue.status("stubborn")["accounting"]["work_redone_seconds"] > 0


def test_non_preemptible_holder_makes_the_urgent_run_wait(segue: Segue, tmp_path: Path) -> None:
    g = gates(tmp_path, "pinned")
    setup_pool(segue, 1)
    start(segue, "pinned", "batch", 150, "--no-preemptible", gate=g["pinned"])
    wait_for(lambda: running(segue, "pinned"), 120, "pinned")
    start(segue, "hi", "urgent", 20)
    queued = wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "hi"], 120,
                      "hi queued")
    assert queued[0]["reason"].startswith("waiting for 1 gpu")
    assert segue.status("pinned")["state"] == "RUNNING"
    g["pinned"].touch()
    segue.wait_state("pinned", {"SUCCEEDED"}, 120)
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    check_output(segue, "pinned", 150)
    check_output(segue, "hi", 20)
    assert not any(e["kind"] == "scheduler" and e["reason"].startswith("preempting")
                   for e in segue.events("hi"))


def test_crashed_holder_devices_return_after_its_lease(segue: Segue, tmp_path: Path) -> None:
    g = gates(tmp_path, "first")
    setup_pool(segue, 1)
    # The default lease (10s): a shorter one expires while a worker still imports
    # on a loaded machine, which would fail attempts that are perfectly alive.
    env: dict[str, str] = {}
    start(segue, "first", "normal", 1000, env=env, gate=g["first"])
    wait_for(lambda: running(segue, "first"), 120, "first")
    start(segue, "second", "normal", 30, env=env)
    wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "second"], 120,
             "second queued")
    os.kill(segue.status("first")["controller"]["pid"], signal.SIGKILL)  # the holder crashes
    wait_for(lambda: segue.status("second")["state"] == "SUCCEEDED" or running(segue, "second"),
             120, "the device to return")
    segue.wait_state("second", {"SUCCEEDED"}, 120)
    check_output(segue, "second", 30)
    pool = segue.json("pool")
    assert pool["devices"][0]["holder"] is None


def test_pool_and_queue_commands(segue: Segue) -> None:
    setup_pool(segue, 2)
    doc = segue.json("pool")
    assert doc["source"] == "configured" and len(doc["devices"]) == 2
    assert all(d["virtual"] and d["holder"] is None for d in doc["devices"])
    assert segue.json("queue") == []
    proc = segue("run", GPUJOB, "--priority", "asap")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "segue: priority 'asap' is unknown; use one of urgent, high, normal, batch or an integer"
    )


@pytest.mark.gpu
def test_task_sees_only_its_own_gpu(segue: Segue) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here; run on a GPU machine")
    segue("pool", "detect", check=True)
    pool = segue.json("pool")
    assert pool["source"] in ("nvml", "nvidia-smi") and len(pool["devices"]) >= 1
    assert all(not d["virtual"] and d["memory"] > 0 for d in pool["devices"])
    segue("run", str(FLOWS / "cudasee.py"), "--run-id", "see", check=True)
    cpu, gpu = segue.output("see", "cpu_step"), segue.output("see", "gpu_step")
    assert cpu == {"visible": "", "count": 0}  # a CPU step sees no GPU at all
    assert gpu["visible"] == "0" and gpu["count"] == 1 and gpu["sum"] == 1024.0


def _resumed_at(segue: Segue, run: str) -> float:
    return next(e["time"] for e in segue.events(run) if "resuming after preemption" in e["reason"])


def test_preempted_runs_resume_in_priority_order(segue: Segue, tmp_path: Path) -> None:
    g = gates(tmp_path, "batch", "normal", "urgent")
    setup_pool(segue, 1)
    start(segue, "batch", "batch", 800, gate=g["batch"])
    wait_for(lambda: running(segue, "batch"), 120, "batch")
    start(segue, "normal", "normal", 600, gate=g["normal"])  # preempts batch
    wait_for(lambda: running(segue, "normal") and progressed(segue, "normal", 20), 120, "normal")
    start(segue, "urgent", "urgent", 60, gate=g["urgent"])  # preempts normal
    wait_for(lambda: running(segue, "urgent"), 120, "urgent")
    assert segue.status("batch")["state"] == segue.status("normal")["state"] == "PAUSED"
    g["urgent"].touch()
    segue.wait_state("urgent", {"SUCCEEDED"}, 120)
    # The device is free: the higher class resumes; the batch run keeps waiting.
    wait_for(lambda: running(segue, "normal"), 120, "normal to resume")
    assert segue.status("batch")["state"] == "PAUSED"
    g["normal"].touch()
    g["batch"].touch()
    for r in ("normal", "batch"):
        segue.wait_state(r, {"SUCCEEDED"}, 120)
    # The higher class resumed first; the batch run waited until it was done.
    assert _resumed_at(segue, "normal") < _resumed_at(segue, "batch")
    normal_done = max(e["time"] for e in segue.events("normal") if e["to_state"] == "SUCCEEDED")
    assert _resumed_at(segue, "batch") >= normal_done
    for r, n in (("urgent", 60), ("normal", 600), ("batch", 800)):
        check_output(segue, r, n)


def test_preempted_run_resumes_even_if_its_controller_is_gone(segue: Segue, tmp_path: Path
                                                             ) -> None:
    g = gates(tmp_path, "low", "hi")
    setup_pool(segue, 1)
    start(segue, "low", "batch", 800, gate=g["low"])
    wait_for(lambda: running(segue, "low") and progressed(segue, "low", 30), 120, "low")
    start(segue, "hi", "urgent", 80, gate=g["hi"])
    wait_for(lambda: running(segue, "hi"), 120, "hi")
    waiting = segue.wait_state("low", {"PAUSED"}, 60)
    assert waiting["accounting"]["waiting_for_resources"]
    os.kill(waiting["controller"]["pid"], signal.SIGKILL)  # the process that would resume it dies
    g["low"].touch()
    g["hi"].touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    segue.wait_state("low", {"SUCCEEDED"}, 180)
    check_output(segue, "low", 800)
    assert any("starting a controller to resume this preempted run" in e["reason"]
               for e in segue.events("low"))
