"""The device pool is the machine's, not a home's: runs of different homes share it.

Real CLI processes, real controllers and workers, real SIGKILLs; virtual GPUs.
Every test's SEGUE_POOL is a file of its own (tests/conftest.py).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from segue_helpers import FLOWS, Segue, wait_for
from test_preemption import GPUJOB, expected_acc, running, setup_pool, start

from segue.cli.sched import format_pool
from segue.scheduler.views import pool_doc
from segue.store.hostpool import SQLiteHostPool
from segue.store.pool import AllocationRecord, DeviceRecord, HostPool

GATED = str(FLOWS / "gpugate.py")


def _pool() -> SQLiteHostPool:
    return SQLiteHostPool(os.environ["SEGUE_POOL"])


def _gated(segue: Segue, run: str, priority: str, gate: Path) -> None:
    segue("run", GATED, "--detach", "--run-id", run, "--priority", priority, "-p", f"gate={gate}",
          check=True)


def _holding(segue: Segue, run: str, ticks: int = 0) -> bool:
    s = segue.step(run, "hold")
    return s["state"] == "RUNNING" and bool(s["pid"]) and (s["last_checkpoint"] is not None
                                                           or not ticks)


def _exact(segue: Segue, run: str) -> dict:
    out = segue.output(run, "hold")
    assert out["ticks"] > 0 and out["acc"] == expected_acc(out["ticks"])  # nothing lost or repeated
    return out


def test_urgent_run_of_another_home_preempts_and_orphan_resumes_across_homes(
        tmp_path: Path) -> None:
    a, b = Segue(tmp_path / "userA" / ".segue"), Segue(tmp_path / "userB" / ".segue")
    # Each run holds the device until the test opens its gate: no outcome depends on timing.
    gate_low, gate_hi = tmp_path / "gate-low", tmp_path / "gate-hi"
    setup_pool(a, 1)  # the pool is the host's: configured from home A, used by both
    _gated(a, "low", "batch", gate_low)
    wait_for(lambda: _holding(a, "low", ticks=1), 120, "low to run and checkpoint in home A")
    _gated(b, "hi", "urgent", gate_hi)
    wait_for(lambda: _holding(b, "hi"), 120, "the urgent run of home B to get the device")
    low = a.wait_state("low", {"PAUSED"}, 120)
    assert a.step("low", "hold")["pid"] is None
    # The process that would resume it dies while it waits: the controller of
    # the other home that frees the device must start one for it.
    os.kill(low["controller"]["pid"], signal.SIGKILL)
    gate_low.touch()  # low may finish once it is back
    gate_hi.touch()
    hi = b.wait_state("hi", {"SUCCEEDED"}, 120)
    assert hi["steps"][0]["attempts"] == 1
    a.wait_state("low", {"SUCCEEDED"}, 180)
    assert _exact(b, "hi")["seen"] == ["0"]
    assert _exact(a, "low")["seen"] == ["0", "0"]  # preempted once, resumed from its checkpoint

    home_a, home_b = str(a.home.resolve()), str(b.home.resolve())
    hi_events = [e["reason"] for e in b.events("hi") if e["kind"] == "scheduler"]
    assert any(r.startswith(f"preempting low of home {home_a} (batch") for r in hi_events), hi_events
    low_events = [e["reason"] for e in a.events("low")]
    assert any(r.startswith("preempted by run 'hi' (urgent) of home " + home_b)
               for r in low_events), low_events
    assert any("capacity freed by run 'hi' of home " + home_b in r for r in low_events)
    assert any("resuming after preemption" in r for r in low_events)

    history = _pool().list_allocations(live_only=False)
    assert {(h.home, h.run_id) for h in history} == {(home_a, "low"), (home_b, "hi")}
    assert all(h.released_at is not None for h in history)
    spans = sorted((h.since, h.released_at, h.home) for h in history if 0 in h.devices)
    assert len(spans) >= 3  # low, then hi, then low again
    for (_s1, e1, w1), (s2, _, w2) in zip(spans, spans[1:], strict=False):
        assert e1 is not None and e1 <= s2, f"gpu 0 held by {w1} until {e1} and by {w2} from {s2}"
    assert _pool().parked() == []  # nothing left waiting


def test_runs_that_can_never_fit_are_refused_at_submit(segue: Segue) -> None:
    setup_pool(segue, 1)
    proc = segue("run", GPUJOB, "--gpus", "2", "--run-id", "two")
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(
        "segue: step 'work' needs 2 gpus but host ") and "has 1 gpu; it can never run here" in proc.stderr
    assert not segue.home.exists()  # nothing written
    proc = segue("run", GPUJOB, "--gpu-mem", "100GiB", "--run-id", "big")
    assert proc.returncode == 2 and "needs 100 GiB on 1 gpu but host " in proc.stderr
    segue("pool", "set", "--gpus", "0", check=True)  # a host without GPUs
    proc = segue("run", GPUJOB, "--detach", "--run-id", "one")
    assert proc.returncode == 2 and "needs 1 gpu but host" in proc.stderr
    assert "has 0 gpus" in proc.stderr and "segue pool set --gpus N" in proc.stderr
    assert not segue.home.exists()


def test_a_waiting_run_shows_waiting_and_fails_when_the_pool_shrinks(segue: Segue) -> None:
    setup_pool(segue, 1)
    start(segue, "pinned", "batch", 100000, "--no-preemptible")
    wait_for(lambda: running(segue, "pinned"), 120, "pinned to hold the device")
    start(segue, "waiter", "normal", 20)
    wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "waiter"], 120,
             "waiter queued")
    ls = {r["run_id"]: r for r in segue.json("ls")}
    assert ls["waiter"]["state"] == "RUNNING" and ls["waiter"]["shown"] == "WAITING (normal)"
    assert ls["pinned"]["shown"] == "RUNNING"
    text = segue("ls").stdout
    assert "WAITING (normal)" in next(line for line in text.splitlines() if line.startswith("waiter"))
    segue("pool", "set", "--gpus", "0", check=True)  # capacity shrinks under the waiting run
    run = segue.wait_state("waiter", {"FAILED"}, 120)
    assert run["steps"][0]["state"] == "PENDING"
    last = [e for e in segue.events("waiter") if e["to_state"] == "FAILED"][-1]
    assert last["reason"].startswith("step 'work' needs 1 gpu but host ")
    assert "has 0 gpus; it can never run here" in last["reason"]
    segue("cancel", "pinned", check=True)
    segue.wait_state("pinned", {"CANCELLED"}, 60)


def test_a_preempted_run_fails_when_the_pool_shrinks_under_it(segue: Segue, tmp_path: Path) -> None:
    gate_low, gate_hi = tmp_path / "gate-low", tmp_path / "gate-hi"
    setup_pool(segue, 1)
    _gated(segue, "low", "batch", gate_low)
    wait_for(lambda: _holding(segue, "low", ticks=1), 120, "low to run and checkpoint")
    _gated(segue, "hi", "urgent", gate_hi)
    wait_for(lambda: _holding(segue, "hi"), 120, "the urgent run to get the device")
    low = segue.wait_state("low", {"PAUSED"}, 120)
    assert low["controller"]["alive"]  # it waits, PAUSED, for the device to come back
    segue("pool", "set", "--gpus", "0", check=True)  # it never will
    low = segue.wait_state("low", {"FAILED"}, 120)
    assert low["steps"][0]["state"] == "PENDING"  # its checkpoint is kept for a later resume
    reasons = [e["reason"] for e in segue.events("low") if e["to_state"] in ("RUNNING", "FAILED")]
    assert reasons[-1].startswith("step 'hold' needs 1 gpu but host ") and "has 0 gpus" in reasons[-1]
    assert "segue pool set --gpus N" in reasons[-1]
    assert reasons[-2].endswith("it no longer waits for capacity")
    assert (str(segue.home.resolve()), "low") not in _pool().parked()
    gate_hi.touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)  # the run that held the device is unaffected


def test_verify_of_a_gpu_flow_uses_the_pool_it_was_started_with(segue: Segue) -> None:
    setup_pool(segue, 1)
    # Before the pool was host-wide, the sandbox home had a pool of its own
    # with no GPU and this waited for ever.
    # No faults: the flow records its attempts in its output, which a kill changes.
    proc = segue("verify", GPUJOB, "-p", "n=60", "--kills", "0", "--pauses", "0", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verify: IDENTICAL" in proc.stdout
    history = _pool().list_allocations(live_only=False)
    assert history and all("segue-verify-" in h.home for h in history)  # the sandboxes' runs
    assert all(h.devices == (0,) for h in history)


def test_pool_detect_keeps_configured_virtual_gpus_unless_replaced(segue: Segue) -> None:
    setup_pool(segue, 2)
    proc = segue("pool", "detect")
    assert proc.returncode == 2
    assert "has 2 configured virtual gpus" in proc.stderr and "--replace" in proc.stderr
    assert len(segue.json("pool")["devices"]) == 2  # nothing changed
    assert segue.json("pool", "--all-hosts") == [segue.json("pool")]  # a machine's pool: this host
    proc = segue("pool", "detect", "--replace")
    assert proc.returncode == 0, proc.stderr
    doc = segue.json("pool")
    assert doc["source"] != "configured" and not any(d["virtual"] for d in doc["devices"])


def test_pool_command_reports_devices_used_outside_the_pool() -> None:
    gib = 2**30
    hp = HostPool("h", 8.0, 64 * gib, "nvml", tuple(
        DeviceRecord("h", i, "NVIDIA H200", 141 * gib, False) for i in range(3)), 0.0)
    held = AllocationRecord(
        id=1, host="h", home="/x/.segue", run_id="train", step="fit", epoch=1, devices=(0,),
        cpus=1.0, memory=0, priority=300, preemptible=False, since=0.0, lease_until=9e9,
        released_at=None, ckpt_at=None, preemptions=0)
    # gpu 0: our own worker; gpu 1: someone else's process; gpu 2: idle.
    doc = pool_doc(hp, [held], {0: [(111, 2 * gib)], 1: [(4242, 3 * gib)], 2: []})
    assert [d["busy_outside_pool"] for d in doc["devices"]] == [False, True, False]
    lines = format_pool(doc)
    assert "train/fit (urgent)" in lines[1] and "home /x/.segue" in lines[1]
    assert lines[2].endswith("free in the pool but IN USE by processes outside it: pid 4242 (3.0 GiB)")
    assert lines[3].endswith("free")


@pytest.mark.gpu
def test_pool_shows_real_gpu_processes() -> None:
    from segue.scheduler.devices import detect_gpus, gpu_processes

    source, devs = detect_gpus()
    if not devs:
        pytest.skip("no GPU driver here; run on a GPU machine")
    procs = gpu_processes()
    assert set(procs) == set(range(len(devs)))
    assert all(isinstance(pid, int) and mem >= 0 for ps in procs.values() for pid, mem in ps)
