"""Accounting adds up, and money is resource-hours x price (docs/accounting.md).

The run tests use real controllers and workers on virtual GPUs: one kills a
worker with SIGKILL mid-step, one is preempted by an urgent run; both at a
gate the step waits at, so where the fault lands does not depend on speed. Bounds come
from what the store recorded (event and checkpoint times) and from the
test's own clock readings around the kill, never from sleeps.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.errors import UsageError
from segue.placement.pricing import DEFAULTS, Prices, device_type, load_overrides, save_overrides
from segue.scheduler.accounting import attempt_deltas

GATED = str(FLOWS / "gatedgpu.py")
EPS = 2e-3  # status rounds seconds to 3 decimals
V, CPU, GB_MONTH = 3.6, 0.36, 100.0  # USD per virtual-GPU-hour, per core-hour, per GB-month


def _expected_acc(n: int) -> float:
    import numpy as np

    gen = np.random.default_rng(3)
    return sum(gen.random() for _ in range(n))


def _setup(segue: Segue) -> None:
    for args in (("pool", "set", "--gpus", "1", "--gpu-mem", "80GB", "--cpus", "8"),
                 ("prices", "set", "virtual", str(V)), ("prices", "set", "cpu", str(CPU)),
                 ("prices", "set", "storage", str(GB_MONTH))):
        proc = segue(*args)
        assert proc.returncode == 0, proc.stderr


def _work(segue: Segue, run: str) -> dict[str, Any]:
    return segue.step(run, "work")


def _attempt_starts(segue: Segue, run: str) -> dict[int, float]:
    return {e["data"]["attempt"]: e["time"] for e in segue.events(run)
            if e["kind"] == "task" and e["to_state"] == "RUNNING" and "attempt" in e["data"]}


def _check_identities(acct: dict[str, Any], gpus_per_attempt: float, cpus_per_attempt: float) -> None:
    """The figures add up, and cost = resource-hours x price, for a finished run."""
    dev, useful, redone = (acct["device_seconds"], acct["device_seconds_useful"],
                           acct["device_seconds_redone"])
    assert dev == pytest.approx(useful + redone, abs=EPS)
    assert dev == pytest.approx(gpus_per_attempt * acct["attempt_seconds"], abs=EPS)
    assert redone == pytest.approx(gpus_per_attempt * acct["work_redone_seconds"], abs=EPS)
    cores = acct["cpu_core_seconds"]
    assert cores == pytest.approx(cpus_per_attempt * acct["attempt_seconds"], abs=EPS)
    assert acct["by_type"]["virtual"]["seconds"] == pytest.approx(dev, abs=EPS)
    assert acct["by_type"]["virtual"]["usd_per_hour"] == V
    c = acct["cost"]
    assert c["so_far"] == pytest.approx(dev / 3600 * V + cores / 3600 * CPU, abs=1e-3)
    assert c["redone"] == pytest.approx(
        redone / 3600 * V + acct["cpu_core_seconds_redone"] / 3600 * CPU, abs=1e-3)
    assert c["so_far"] == pytest.approx(c["useful"] + c["redone"], abs=2e-4)
    saved = acct["device_seconds_saved_by_resume"]
    assert saved == pytest.approx(gpus_per_attempt * acct["seconds_saved_by_resume"], abs=EPS)
    assert c["avoided_by_resume"] == pytest.approx(
        saved / 3600 * V + cpus_per_attempt * acct["seconds_saved_by_resume"] / 3600 * CPU, abs=1e-3)
    stored = acct["checkpoint_bytes_stored"]
    assert 0 < stored <= acct["checkpoint_bytes"]
    assert c["storage_per_month"] == pytest.approx(stored / 1e9 * GB_MONTH, abs=1e-3)
    assert c["storage_usd_per_gb_month"] == GB_MONTH


def _held(segue: Segue, run: str, attempt: int) -> dict[str, Any] | None:
    """The step, once the given attempt waits at the gate (its checkpoint at i=100 is committed)."""
    s = _work(segue, run)
    ck = s["last_checkpoint"]
    ok = (s["state"] == "RUNNING" and s["attempts"] == attempt and s["pid"] and ck
          and ck["position"] == {"i": 100} and (s["progress"]["done"] or 0) >= 100)
    return s if ok else None


def test_kill_and_resume_accounting_adds_up(segue: Segue, tmp_path: Path) -> None:
    _setup(segue)
    gate = tmp_path / "gate"
    segue("run", GATED, "--detach", "--run-id", "k1", "-p", f"gate={gate}",
          env={"SEGUE_BACKOFF_BASE_S": "0.05"}, check=True)
    first = wait_for(lambda: _held(segue, "k1", 1), 120, "attempt 1 to wait at the gate")
    live = segue.status("k1")["accounting"]  # no attempt has ended: all of it is the running one
    assert live["device_seconds"] > 0 and live["device_seconds_redone"] == 0
    assert live["cost"]["so_far"] > 0 and live["resumes"] == 0
    t_kill = time.time()
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(lambda: _work(segue, "k1")["attempts"] >= 2, 120, "the retry to start")
    t_seen = time.time()  # the killed attempt was accounted before its retry was placed
    wait_for(lambda: _held(segue, "k1", 2), 120, "attempt 2 to resume and wait at the gate")
    gate.touch()
    segue.wait_state("k1", {"SUCCEEDED"}, 120)
    out = segue.output("k1", "work")
    assert out["i"] == 200 and out["acc"] == _expected_acc(200)  # nothing lost or repeated

    cks = json.loads(segue("checkpoints", "k1", "--json").stdout)
    ck1 = max((c for c in cks if c["epoch"] == 1), key=lambda c: c["seq"])
    assert ck1["position"] == {"i": 100}  # the kill landed at the gate, after that checkpoint
    start1 = _attempt_starts(segue, "k1")[1]
    doc = segue.status("k1")
    acct = doc["accounting"]
    _check_identities(acct, 1, 0.5)
    assert acct["resumes"] == 1 and acct["preemptions"] == 0
    # Redone: what the killed attempt did after its last checkpoint, bounded by the
    # kill (it ran at least until then) and by our seeing the retry (it was counted by then).
    redone = acct["work_redone_seconds"]
    assert t_kill - ck1["created_at"] - EPS <= redone <= t_seen - ck1["created_at"] + EPS
    # Saved by the one resume: the attempt's work up to its last checkpoint, which a
    # restart from zero would have redone; never more than the run's useful work.
    saved = acct["seconds_saved_by_resume"]
    assert 0 < saved <= ck1["created_at"] - start1 + EPS
    assert saved + redone <= t_seen - start1 + EPS
    assert saved <= acct["device_seconds_useful"]
    failure = next(s for s in doc["steps"] if s["name"] == "work")["last_failure"]
    assert failure["attempt"] == 1 and "SIGKILL" in failure["error"]
    assert failure["traceback_tail"] == []  # killed by a signal: no Python traceback to keep

    # The --price flag re-prices this display only; the home's price stays.
    again = segue.json("status", "k1", "--price", f"virtual={2 * V}")["accounting"]
    assert again["cost"]["so_far"] == pytest.approx(
        acct["cost"]["so_far"] + acct["device_seconds"] / 3600 * V, abs=1e-3)
    assert segue.status("k1")["accounting"]["cost"]["so_far"] == acct["cost"]["so_far"]
    text = segue("status", "k1").stdout
    assert f"{acct['device_seconds']:.1f} device-s = {acct['device_seconds_useful']:.1f} useful" in text
    assert "avoided by resuming" in text and "/month while kept" in text


def test_preempted_run_saves_less_than_it_used(segue: Segue, tmp_path: Path) -> None:
    """The reported case: one preemption, and "saved by resuming" exceeded the total."""
    _setup(segue)
    gate = tmp_path / "gate"
    segue("run", GATED, "--detach", "--run-id", "low", "--priority", "batch", "-p", f"gate={gate}",
          check=True)
    wait_for(lambda: _held(segue, "low", 1), 120, "low to wait at the gate")
    segue("run", GATED, "--detach", "--run-id", "hi", "--priority", "urgent", "-p", "n=30",
          check=True)
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    wait_for(lambda: _held(segue, "low", 2), 120, "low to resume by itself")
    gate.touch()
    segue.wait_state("low", {"SUCCEEDED"}, 120)
    assert segue.output("low", "work")["acc"] == _expected_acc(200)
    acct = segue.status("low")["accounting"]
    _check_identities(acct, 1, 0.5)
    assert acct["preemptions"] == 1 and acct["resumes"] == 1
    assert acct["work_redone_seconds"] == 0  # it parked at a checkpoint: nothing to redo
    starts = _attempt_starts(segue, "low")
    saved = acct["seconds_saved_by_resume"]
    # One resume saves at most what the step did before it: less than the run's total.
    assert 0 < saved <= starts[2] - starts[1] + EPS
    assert acct["device_seconds_saved_by_resume"] < acct["device_seconds"]


# -- the pure parts: counting once per resume, the catalog, the prices file ------------

def test_saved_is_credited_once_per_resume_and_bounded_by_useful_work() -> None:
    stats: dict[str, float] = {}

    def end(epoch: int, dur: float, lost: float, interrupted: bool) -> None:
        add, put = attempt_deltas(stats, "s", epoch, {"h100": 2.0, "cpu": 1.0}, dur=dur,
                                  lost=lost, interrupted=interrupted)
        stats.update(put)
        for k, v in add.items():
            stats[k] = stats.get(k, 0.0) + v

    end(1, 10.0, 2.0, True)  # killed 2 s after its last checkpoint
    assert stats.get("resumes", 0) == 0 and stats.get("saved_s", 0) == 0  # not resumed yet
    end(2, 5.0, 0.0, True)  # the resume; then parked at a checkpoint
    assert stats["resumes"] == 1 and stats["saved_s"] == 8.0  # attempt 1's useful work
    end(3, 4.0, 0.0, False)  # resumed again; completes
    assert stats["resumes"] == 2 and stats["saved_s"] == 8.0 + 13.0  # once per resume
    assert stats["device_s"] == 2 * 19.0
    assert stats["held:h100"] == stats["useful:h100"] + stats["redone:h100"] == 38.0
    assert stats["redone:h100"] == 4.0 and stats["redone:cpu"] == 2.0
    assert stats["saved:h100"] == 2 * 21.0 and stats["device_s_saved"] == 42.0
    # Each credit was at most the useful work done before it: 8 <= 8, 13 <= 13.
    assert stats["saved_s"] <= stats["resumes"] * stats["step:s:useful_s"]
    end(4, 1.0, 5.0, False)  # lost is clamped to the attempt's duration
    assert stats["redone:cpu"] == 3.0


@pytest.mark.parametrize(("name", "memory", "virtual", "key"), [
    ("NVIDIA H200", 141 << 30, False, "h200"),
    ("NVIDIA H100 80GB HBM3", 80 << 30, False, "h100"),
    ("NVIDIA A100-SXM4-40GB", 40 << 30, False, "a100-40gb"),
    ("NVIDIA A100-SXM4-80GB", 80 << 30, False, "a100-80gb"),
    ("NVIDIA A100 PCIe", 80 << 30, False, "a100-80gb"),
    ("NVIDIA L4", 24 << 30, False, "l4"),
    ("NVIDIA L40S", 48 << 30, False, "l40s"),  # not an L4
    ("NVIDIA B200", 180 << 30, False, "b200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96 << 30, False, "rtx-pro-6000-blackwell"),
    ("virtual-0", 80 << 30, True, "virtual"),
])
def test_device_types(name: str, memory: int, virtual: bool, key: str) -> None:
    assert device_type(name, memory, virtual) == key


def test_cost_is_resource_hours_times_price_and_prices_file_round_trips(tmp_path: Path) -> None:
    p = Prices.resolve(None, {"h100": 10.0})
    assert p.cost({"h100": 7200.0, "cpu": 3600.0}) == 20.0 + DEFAULTS["cpu"]
    assert p.per_hour("l40s") == DEFAULTS["gpu"]  # an unknown GPU takes the generic price
    save_overrides(tmp_path, {"l40s": 1.5, "storage": 0.03})
    assert (tmp_path / "prices.json").stat().st_mode & 0o077 == 0
    assert load_overrides(tmp_path) == {"l40s": 1.5, "storage": 0.03}
    q = Prices.resolve(tmp_path, {"storage": 0.05})  # the flag wins over the home
    assert q.per_hour("l40s") == 1.5 and q.storage_per_month(2 * 10**9) == pytest.approx(0.1)
    (tmp_path / "prices.json").write_text('{"version": 1, "usd": {"h100": -1}}')
    with pytest.raises(UsageError, match=r"^price of 'h100' must be a finite number >= 0"):
        load_overrides(tmp_path)
    assert math.isfinite(Prices.resolve().per_hour("b200"))


def test_prices_cli_refuses_bad_input_and_writes_nothing(segue: Segue) -> None:
    for args, pattern in [
        (("prices", "set", "h100", "nan"), r"price 'nan' must be finite"),
        (("prices", "set", "h100", "abc"), r"price 'abc' is not a number of US dollars"),
        (("prices", "set", "h100", "-1"), r"price of 'h100' must be a finite number >= 0, not -1\.0"),
        (("prices", "set", "../x", "1"), r"price key '\.\./x' is invalid; .*"),
        (("prices", "unset", "h100"), r"no price of your own is set for 'h100'; set ones: none"),
    ]:
        proc = segue(*args)
        assert proc.returncode == 2 and proc.stdout == ""
        assert re.fullmatch(f"segue: {pattern}\n", proc.stderr), proc.stderr
    assert not (segue.home / "prices.json").exists()
    assert segue("prices", "set", "h100", "9.5").returncode == 0
    rows = {r["key"]: r for r in segue.json("prices")}
    assert rows["h100"]["usd"] == 9.5 and rows["h100"]["set_here"]
    assert rows["h200"]["usd"] == DEFAULTS["h200"] and not rows["h200"]["set_here"]
    assert segue("prices", "unset", "h100").returncode == 0
    assert {r["key"]: r for r in segue.json("prices")}["h100"]["usd"] == DEFAULTS["h100"]
