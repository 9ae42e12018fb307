"""`segue queue` names the run it cannot preempt; `segue status` and `segue ls` agree
on WAITING. Real controllers on virtual GPUs, each holder gated so no outcome
depends on the machine's speed."""

from __future__ import annotations

from pathlib import Path

from segue_helpers import Segue, wait_for
from test_preemption import check_output, running, setup_pool, start


def test_queue_names_the_non_preemptible_run_holding_the_device(segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    setup_pool(segue, 1)
    start(segue, "pinned", "batch", 40, "--no-preemptible", gate=gate)
    wait_for(lambda: running(segue, "pinned"), 120, "pinned to hold the gpu")
    start(segue, "hi", "urgent", 10)
    queued = wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "hi"], 120, "hi queued")
    reason = queued[0]["reason"]
    assert reason.startswith("waiting for 1 gpu")  # the scheduler's reason, then who holds it
    assert reason.endswith("; gpu 0 held by run 'pinned' (step 'work', batch), which is not preemptible"), reason
    text = segue("queue").stdout
    assert "hi/work" in text and "held by run 'pinned'" in text, text
    gate.touch()
    segue.wait_state("hi", {"SUCCEEDED"}, 120)
    check_output(segue, "hi", 10)


def test_a_preemptible_holder_of_the_same_priority_is_not_named(segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    setup_pool(segue, 1)
    start(segue, "first", "normal", 40, gate=gate)
    wait_for(lambda: running(segue, "first"), 120, "first to hold the gpu")
    start(segue, "second", "normal", 10)
    queued = wait_for(lambda: [q for q in segue.json("queue") if q["run_id"] == "second"], 120,
                      "second queued")
    assert "held by" not in queued[0]["reason"], queued  # it only waits its turn
    # ls and status say the same of the waiting run, by the same rule.
    def shown() -> dict[str, str]:
        return {r["run_id"]: r["shown"] for r in segue.json("ls")}

    # (the home's own view of the request is written just after the pool's)
    listed = wait_for(lambda: (d := shown())["second"] == "WAITING (normal)" and d, 60, "ls: WAITING")
    assert listed["first"] == "RUNNING", listed
    assert segue.status("second")["shown"] == "WAITING (normal)"
    assert segue.status("second")["state"] == "RUNNING"  # the stored state is unchanged
    header = segue("status", "second").stdout.splitlines()[0]
    assert header.startswith("run second  WAITING (normal)  flow gpujob"), header
    assert segue("status", "first").stdout.startswith("run first  RUNNING  flow gpujob")
    gate.touch()
    segue.wait_state("second", {"SUCCEEDED"}, 120)
    assert segue.status("second")["shown"] == "SUCCEEDED"
