"""`segue ckpt now`: a step checkpoints at its next pause point because the operator asked.

The step's interval is an hour, so the one checkpoint it commits was asked for.
(On Ray the request goes through the attempt's actor: tests/executor/test_ray_executor.py.)
"""

from __future__ import annotations

from pathlib import Path

from segue_helpers import FLOWS, Segue, wait_for

from segue.home import Home


def test_ckpt_now_commits_one_checkpoint_of_a_step_that_would_not(segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", str(FLOWS / "ondemand.py"), "--run-id", "od", "--detach", "-p", f"gate={gate}", check=True)
    store = Home.resolve(segue.home).open_store()
    # Progress is reported by the step itself: its worker is past its start-up.
    wait_for(lambda: (store.get_task("od", "loop").progress_done or 0) > 0, 60, "the step running")
    assert store.list_checkpoints("od", "loop") == []
    proc = segue("ckpt", "now", "od")
    assert proc.returncode == 0 and "asked loop to checkpoint now" in proc.stdout, proc.stderr
    wait_for(lambda: len(store.list_checkpoints("od", "loop")) == 1, 60, "the asked-for checkpoint")
    gate.touch()
    segue.wait_state("od", {"SUCCEEDED"}, 60)
    assert len(store.list_checkpoints("od", "loop")) == 1  # one asked, none of its own
    proc = segue("ckpt", "now", "od")
    assert proc.returncode == 2 and "run 'od' has no running task on this host to checkpoint" in proc.stderr
