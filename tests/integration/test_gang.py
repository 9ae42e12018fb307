"""Gang steps (``world_size=N``): N rank processes, one checkpoint committed in two phases.

Kill a rank before and after it votes, and the coordinator between the phases:
no partial checkpoint is ever restored, an uncommitted one is removed, and the
run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from gangkit import GANG, PHASES, QUICK, N, check_output, check_torn, failures
from gangkit import open_run as _open
from segue_helpers import FLOWS, Segue, wait_for

from segue import checkpoint as ckpt


def test_a_gang_step_runs_its_ranks_and_commits_every_checkpoint_whole(segue: Segue) -> None:
    proc = segue("run", GANG, "--run-id", "g", "-p", f"n={N}", env=QUICK)
    assert proc.returncode == 0, proc.stderr
    check_output(segue, "g")
    store, storage = _open(segue, "g")
    assert [c.seq for c in store.list_checkpoints("g", "train")] == [8, 7, 6]  # every 5 steps, 3 kept
    task = store.get_task("g", "train")
    assert task.attempts == 1 and task.progress_done == N


@pytest.mark.parametrize(("fault", "role", "committed"), PHASES, ids=[p[0].split(":")[0] for p in PHASES])
def test_kill_at_each_phase_of_a_gang_checkpoint(segue: Segue, fault: str, role: str,
                                                 committed: bool | None) -> None:
    env = {**QUICK, "SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": role, "SEGUE_FAULTS_EPOCHS": "1"}
    proc = segue("run", GANG, "--run-id", "torn", "-p", f"n={N}", "-p", "sleep=0.002", env=env)
    assert proc.returncode == 0, proc.stderr
    check_torn(segue, "torn", fault, role, committed)


def test_a_corrupt_rank_shard_falls_back_to_the_previous_checkpoint_visibly(
        segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", GANG, "--run-id", "bad", "--detach", "-p", f"n={N}", "-p", f"gate={gate}", "-p", "hold=20",
          env=QUICK, check=True)
    store, storage = _open(segue, "bad")
    wait_for(lambda: any(c.seq == 4 for c in store.list_checkpoints("bad", "train")), 60,
             "checkpoint 4 (step 20), where the gang holds")
    # Rank 1's shard of the newest checkpoint rots; then the coordinator dies.
    [newest] = [c for c in store.list_checkpoints("bad", "train") if c.seq == 4]
    shard = Path(storage.local_path(f"{newest.path}/rank-1/MANIFEST.json"))
    doc = json.loads(shard.read_text())
    doc["meta"]["rank"] = 7
    shard.write_text(json.dumps(doc))
    pid = store.get_task("bad", "train").pid
    assert pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: store.get_task("bad", "train").attempts == 2 and store.get_task("bad", "train").pid
             not in (None, pid), 60, "the second attempt")
    gate.touch()
    segue.wait_state("bad", {"SUCCEEDED"}, 120)
    warnings = [e for e in store.list_events("bad") if e.kind == "warning"]
    assert any("checkpoint 4" in e.reason and "rank 1's manifest is not the one it voted" in e.reason
               and "using checkpoint 3" in e.reason for e in warnings), [e.reason for e in warnings]
    assert {c.seq: c.status for c in store.list_checkpoints("bad", "train", statuses=("quarantined",))} == \
        {4: "quarantined"}
    check_output(segue, "bad")


def test_a_pause_parks_every_rank_after_the_same_checkpoint(segue: Segue, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    segue("run", GANG, "--run-id", "p", "--detach", "-p", f"n={N}", "-p", f"gate={gate}", "-p", "hold=12",
          env=QUICK, check=True)
    store, _ = _open(segue, "p")
    wait_for(lambda: (store.get_task("p", "train").progress_done or 0) >= 12, 60, "the gang at its gate")
    assert segue("pause", "p").returncode == 0
    segue.wait_state("p", {"PAUSED"}, 60)
    parked = store.list_checkpoints("p", "train")[0]
    assert [r["i"] for r in parked.position["ranks"]] == [12, 12]  # both ranks, the same step
    assert store.get_task("p", "train").state.value == "PARKED"
    gate.touch()
    assert segue("resume", "p", env=QUICK).returncode == 0
    segue.wait_state("p", {"SUCCEEDED"}, 120)
    check_output(segue, "p")
    assert not failures(segue, "p")  # paused, never failed


def test_resuming_with_another_world_size_is_refused_clearly(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "gangn.py"
    flow.write_text(Path(GANG).read_text().replace("world_size=2", 'world_size=int(os.environ["GANG_N"])'))
    gate = tmp_path / "gate"
    segue("run", str(flow), "--run-id", "n", "--detach", "-p", f"n={N}", "-p", f"gate={gate}", "-p", "hold=10",
          env={**QUICK, "GANG_N": "2"}, check=True)
    store, _ = _open(segue, "n")
    wait_for(lambda: (store.get_task("n", "train").progress_done or 0) >= 10, 60, "the gang at its gate")
    assert segue("pause", "n").returncode == 0
    segue.wait_state("n", {"PAUSED"}, 60)
    gate.touch()
    proc = segue("resume", "n", env={**QUICK, "GANG_N": "3"})
    assert proc.returncode == 1 and "world_size=3 but its last checkpoint was written by 2 ranks and is " \
        "not replicated" in proc.stdout, proc.stdout + proc.stderr
    assert store.get_run("n").state.value == "FAILED"
    t = store.get_task("n", "train")
    assert t.attempts == 2  # not retried: retrying cannot help
    assert "world_size=3 but its last checkpoint was written by 2 ranks" in (t.error or ""), t.error
    assert "--restart-step train" in (t.error or "") and "replicated=True" in (t.error or "")


def test_a_replicated_ddp_gang_resumes_on_three_ranks_with_every_record_once(
        segue: Segue, tmp_path: Path) -> None:
    """Paused on two ranks at global batch 3 (24 of 48 records), resumed on three: every
    rank restores rank 0's state, the sampler goes on from record 24 in blocks of
    three ranks, and each epoch sees every record exactly once."""
    pytest.importorskip("torch", reason="the DDP test needs torch: pip install torch")
    flow, gate = str(FLOWS / "ddp_reshard.py"), tmp_path / "gate"
    segue("run", flow, "--run-id", "rs", "--detach", "-p", f"gate={gate}", "-p", "hold=3",
          env={**QUICK, "GANG_N": "2"}, check=True)
    store, storage = _open(segue, "rs")
    wait_for(lambda: (store.get_task("rs", "train").progress_done or 0) >= 3, 120, "the gang at its gate")
    assert segue("pause", "rs").returncode == 0
    segue.wait_state("rs", {"PAUSED"}, 60)
    parked = store.list_checkpoints("rs", "train")[0]
    assert [r["offset"] for r in parked.position["ranks"]] == [24, 24], parked.position
    gang = ckpt.load(storage, parked.path).state["state"]["gang"]
    assert gang["replicated"] is True and gang["world_size"] == 2
    # Rank 0 alone wrote the replicated state; rank 1's shard holds its RNG only.
    assert ckpt.load(storage, f"{parked.path}/rank-1").state["state"] is None
    gate.touch()
    assert segue("resume", "rs", env={**QUICK, "GANG_N": "3"}).returncode == 0
    segue.wait_state("rs", {"SUCCEEDED"}, 180)
    out = segue.output("rs", "train")
    assert out["world_size"] == 3
    assert [(b["epoch"], b["ranks"], len(b["records"])) for b in out["seen"]] == \
        [(0, 2, 8)] * 3 + [(0, 3, 12)] * 2 + [(1, 3, 12)] * 4
    for epoch in (0, 1):
        records = [i for b in out["seen"] if b["epoch"] == epoch for i in b["records"]]
        assert sorted(records) == list(range(48)), (epoch, records)  # none lost, none repeated
    said = [e.reason for e in store.list_events("rs") if e.kind == "checkpoint"]
    assert any("resharding the replicated checkpoint of gang step 'train' from 2 to 3 ranks" in r
               for r in said), said
    assert not failures(segue, "rs")


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"world_size": 0}, "world_size must be an int >= 1"),
    ({"world_size": 2.0}, "world_size must be an int >= 1"),
    ({"world_size": 2, "distributed": "mpi"}, "distributed must be 'gloo' (CPU) or 'nccl' (GPU)"),
])
def test_bad_gang_declarations_say_what_to_write(kwargs: dict[str, Any], says: str) -> None:
    from segue import Flow
    from segue.errors import FlowError

    def train(ctx: Any) -> None: ...

    with pytest.raises(FlowError, match=re.escape(says)):
        Flow("f").step(**kwargs)(train)


def test_ddp_training_killed_and_paused_five_times_ends_bit_identical(segue: Segue, tmp_path: Path) -> None:
    """Two DDP ranks (gloo) with a shuffled sampler and dropout: four attempts each lose a
    rank at their second checkpoint, then the gang is paused and resumed; the final
    weights equal an uninterrupted run's, bit for bit."""
    pytest.importorskip("torch", reason="the DDP test needs torch: pip install torch")
    import torch

    ddp = str(FLOWS / "ddp.py")
    assert segue("run", ddp, "--run-id", "ref", env=QUICK).returncode == 0
    gate = tmp_path / "gate"
    faults = {**QUICK, "SEGUE_FAULTS": "gang.before_vote:kill:2", "SEGUE_FAULTS_IN": "rank0,rank1",
              "SEGUE_FAULTS_EPOCHS": "1,2,3,4"}
    segue("run", ddp, "--run-id", "hit", "--detach", "-p", f"gate={gate}", "-p", "hold=20", env=faults,
          check=True)
    store, _ = _open(segue, "hit")
    wait_for(lambda: (store.get_task("hit", "train").progress_done or 0) >= 20, 180, "the gang at its gate")
    assert segue("pause", "hit").returncode == 0
    segue.wait_state("hit", {"PAUSED"}, 60)
    gate.touch()
    assert segue("resume", "hit", env=QUICK).returncode == 0
    segue.wait_state("hit", {"SUCCEEDED"}, 120)
    kills = [w for w in failures(segue, "hit") if "exit code -9" in w]
    assert len(kills) == 4, failures(segue, "hit")  # every kill landed, one per attempt
    assert store.get_task("hit", "train").attempts == 6  # 4 killed, 1 paused, 1 finished
    ref, got = segue.output("ref", "train"), segue.output("hit", "train")
    assert got["step"] == ref["step"] == 24
    assert ref["weights"].keys() == got["weights"].keys()
    for name, w in ref["weights"].items():
        assert torch.equal(w, got["weights"][name]), name
    assert not torch.equal(ref["weights"]["0.weight"], torch.zeros_like(ref["weights"]["0.weight"]))


def test_ranks_that_ask_at_different_steps_fail_the_step_with_the_reason(segue: Segue, tmp_path: Path) -> None:
    flow = tmp_path / "skew.py"
    flow.write_text(
        "from segue import Flow\n"
        "flow = Flow('skew')\n"
        "@flow.step(world_size=2, retries=3, checkpoint_every_steps=2)\n"
        "def train(ctx):\n"
        "    for i in range(1, 10):\n"
        "        if ctx.checkpoint_due(i + ctx.rank):\n"  # rank 1 is one step ahead
        "            ctx.checkpoint({'i': i})\n")
    proc = segue("run", str(flow), "--run-id", "skew", env=QUICK)
    assert proc.returncode == 1
    store, _ = _open(segue, "skew")
    t = store.get_task("skew", "train")
    assert t.state.value == "FAILED" and t.attempts == 1, t  # not retried: a retry cannot help
    assert "rank 0 due at step 1, rank 1 due at step 2" in (t.error or ""), t.error
    assert not store.list_checkpoints("skew", "train")
