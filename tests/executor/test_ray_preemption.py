"""Priority preemption between runs on a Ray cluster, through segue's device pool.

The cluster's GPUs are one host of the pool (``ray:GCS-ADDRESS``): a run on Ray
waits in the pool's queue and preempts lower-priority Ray runs as a local run
does. The cluster here has one node with one (logical) GPU, so two GPU steps
can never run at once on it: the urgent run's actor is placed only once the
batch run's actor has let the GPU go. Every run holds at a gate the test opens,
so no outcome depends on this machine's speed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import raykit
from raykit import MiB, on_ray, start_cluster
from segue_helpers import FLOWS, Segue, flow_module, wait_for

ray = pytest.importorskip("ray", reason="the Ray executor tests need Ray: pip install 'segue[ray]'")

GPUJOB = str(FLOWS / "gpujob.py")
expected_acc = flow_module("gpujob").expected_acc


@pytest.fixture(scope="module")
def cluster() -> Any:
    c = start_cluster(ray, [{"num_cpus": 2, "num_gpus": 1, "object_store_memory": 80 * MiB}])
    yield c
    ray.shutdown()
    c.shutdown()


def start(segue: Segue, cluster: Any, run: str, priority: str, n: int, gate: Path, *extra: str,
          env: dict[str, str] | None = None) -> None:
    segue("run", GPUJOB, "--detach", "--run-id", run, "--priority", priority, "-p", f"n={n}",
          "-p", f"gate={gate}", *on_ray(cluster), *extra, env=env, check=True)


def running(segue: Segue, run: str) -> bool:
    s = segue.step(run, "work")
    return s["state"] == "RUNNING" and bool(s["pid"])


def progressed(segue: Segue, run: str, at_least: float) -> bool:
    return (segue.step(run, "work")["progress"]["done"] or 0) >= at_least


def check_output(segue: Segue, run: str, n: int) -> dict[str, Any]:
    out = segue.output(run, "work")
    assert out["i"] == n
    assert out["acc"] == expected_acc(n)  # bit-exact: nothing lost or repeated
    return out


def explain(segue: Segue, run: str, pred: Any, timeout: float, what: str) -> Any:
    return raykit.explain(ray, segue, run, pred, timeout, what)


def test_urgent_ray_run_preempts_a_batch_ray_run_which_resumes_by_itself(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    low, hi = tmp_path / "gate-low", tmp_path / "gate-hi"
    start(segue, cluster, "low", "batch", 800, low)
    explain(segue, "low", lambda: running(segue, "low") and progressed(segue, "low", 30), 120,
            "the batch run to run on Ray")
    # The cluster is one host of the pool, and the batch run holds its one GPU there.
    pools = [p for p in segue.json("pool", "--all-hosts") if p["host"].startswith("ray:")]
    assert len(pools) == 1, pools
    assert pools[0]["source"] == "ray" and [d["name"] for d in pools[0]["devices"]] == ["ray-gpu"], pools
    holder = pools[0]["devices"][0]["holder"]
    assert holder is not None and (holder["run_id"], holder["step"]) == ("low", "work"), pools
    start(segue, cluster, "hi", "urgent", 60, hi)
    explain(segue, "hi", lambda: running(segue, "hi"), 120, "the urgent run to get the GPU")
    # One GPU in the cluster: Ray placed the urgent actor, so the batch one let go of it.
    assert segue.status("low")["state"] in ("PAUSING", "PAUSED")
    segue.wait_state("low", {"PAUSED"}, 60)
    assert segue.step("low", "work")["pid"] is None
    hi.touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    low.touch()
    segue.wait_state("low", {"SUCCEEDED"}, 180)
    check_output(segue, "hi", 60)
    out = check_output(segue, "low", 800)
    assert len(out["seen"]) == 2, out["seen"]  # one attempt before the preemption, one after
    hi_events = [e["reason"] for e in segue.events("hi") if e["kind"] == "scheduler"]
    assert any(r.startswith("preempting low (batch") for r in hi_events), hi_events
    low_events = [e["reason"] for e in segue.events("low")]
    assert any("preempted by run 'hi' (urgent)" in r for r in low_events), low_events
    assert any("resuming after preemption" in r for r in low_events), low_events
    assert not any("killed at the pause deadline" in r for r in low_events), low_events
    acct = segue.status("low")["accounting"]
    assert acct["preemptions"] == 1 and acct["work_redone_seconds"] == 0, acct


def test_a_victim_that_ignores_the_pause_is_killed_on_ray_and_stays_correct(
        segue: Segue, cluster: Any, tmp_path: Path) -> None:
    gate, ready = tmp_path / "gate", tmp_path / "ready"
    start(segue, cluster, "stubborn", "batch", 800, gate, "-p", "ignore_pause=true", "-p", f"ready={ready}",
          env={"SEGUE_PAUSE_DEADLINE_S": "0.5"})
    # Once `ready` exists the step has its checkpoint and never reaches a pause point again.
    wait_for(ready.exists, 120, "the stubborn step's checkpoint")
    start(segue, cluster, "hi", "urgent", 30, tmp_path / "open")
    (tmp_path / "open").touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 180)
    events = [e["reason"] for e in segue.events("stubborn")]
    assert any("killed at the pause deadline" in r for r in events), events
    gate.touch()
    segue.wait_state("stubborn", {"SUCCEEDED"}, 180)
    check_output(segue, "stubborn", 800)
    check_output(segue, "hi", 30)
    assert segue.status("stubborn")["accounting"]["work_redone_seconds"] > 0
