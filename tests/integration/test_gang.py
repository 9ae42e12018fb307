"""Gang steps (``world_size=N``): N rank processes, one checkpoint committed in two phases.

Kill a rank before and after it votes, and the coordinator between the phases:
no partial checkpoint is ever restored, an uncommitted one is removed, and the
run ends exactly as an uninterrupted one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue import checkpoint as ckpt
from segue.home import Home

GANG = str(FLOWS / "gang.py")
_spec = importlib.util.spec_from_file_location("_gangflow", GANG)
assert _spec is not None and _spec.loader is not None
_gang = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gang)
QUICK = {"SEGUE_BACKOFF_BASE_S": "0.01", "SEGUE_BACKOFF_MAX_S": "0.05"}
N = 40


def _open(segue: Segue, run: str) -> tuple[Any, Any]:
    home = Home.resolve(segue.home)
    store = home.open_store()
    return store, home.run_storage(store.get_run(run))


def check_whole(segue: Segue, run: str) -> list[dict[str, Any]]:
    """Every committed checkpoint is whole: its gang manifest names both ranks' shards,
    each verifies, matches the hash its rank voted, and both stopped at the same step.
    Returns the newest one's rank states."""
    from segue.run.gang import manifest_digest

    store, storage = _open(segue, run)
    committed = store.list_checkpoints(run, "train")
    assert committed, "no committed checkpoint"
    newest: list[dict[str, Any]] = []
    for c in committed:
        gang = ckpt.load(storage, c.path).state["state"]["gang"]
        assert gang["world_size"] == 2 and [r["rank"] for r in gang["ranks"]] == [0, 1]
        states = []
        for r in gang["ranks"]:
            assert r["path"] == f"{c.path}/rank-{r['rank']}"
            assert manifest_digest(storage, r["path"])[0] == r["manifest_sha256"]
            states.append(ckpt.load(storage, r["path"]).state["state"])
        assert states[0]["i"] == states[1]["i"] == c.position["ranks"][0]["i"], (c.seq, states)
        newest = newest or states
    return newest


def check_output(segue: Segue, run: str) -> None:
    out = segue.output(run, "train")
    assert out == {"i": N, "acc": _gang.expected_acc(0, N), "rank": 0, "world_size": 2}
    last = check_whole(segue, run)
    for rank, state in enumerate(last):  # rank 1's work too: nothing lost or repeated
        assert state["i"] == N and state["acc"] == _gang.expected_acc(rank, N), rank


def failures(segue: Segue, run: str) -> list[str]:
    return [e["reason"] for e in segue.events(run)
            if e["actor"] == "failure-detector" and e["kind"] == "task"]


def test_a_gang_step_runs_its_ranks_and_commits_every_checkpoint_whole(segue: Segue) -> None:
    proc = segue("run", GANG, "--run-id", "g", "-p", f"n={N}", env=QUICK)
    assert proc.returncode == 0, proc.stderr
    check_output(segue, "g")
    store, storage = _open(segue, "g")
    assert [c.seq for c in store.list_checkpoints("g", "train")] == [8, 7, 6]  # every 5 steps, 3 kept
    task = store.get_task("g", "train")
    assert task.attempts == 1 and task.progress_done == N


# Every phase of a gang checkpoint's commit, at its third checkpoint (seq 3), in the
# first attempt only: (fault, the process it kills, is seq 3 committed afterwards?).
PHASES = [
    ("gang.before_vote:kill:3", "rank1", False),  # rank 1's shard is written, not voted
    ("gang.after_vote:kill:3", "rank1", None),  # voted: the commit may or may not win the race
    ("gang.before_manifest:kill:3", "worker", False),  # every vote in, no gang manifest
    ("gang.before_commit:kill:3", "worker", False),  # gang manifest durable, no store record
    ("ctx.after_commit:kill:3", "worker", True),  # committed; the ranks were never told
]


@pytest.mark.parametrize(("fault", "role", "committed"), PHASES, ids=[p[0].split(":")[0] for p in PHASES])
def test_kill_at_each_phase_of_a_gang_checkpoint(segue: Segue, fault: str, role: str,
                                                 committed: bool | None) -> None:
    env = {**QUICK, "SEGUE_FAULTS": fault, "SEGUE_FAULTS_IN": role, "SEGUE_FAULTS_EPOCHS": "1"}
    proc = segue("run", GANG, "--run-id", "torn", "-p", f"n={N}", "-p", "sleep=0.002", env=env)
    assert proc.returncode == 0, proc.stderr
    # The kill landed: the first attempt died of it, the second finished.
    store, storage = _open(segue, "torn")
    assert store.get_task("torn", "train").attempts == 2
    [why] = failures(segue, "torn")
    if role == "rank1":
        assert "rank 1" in why and "exit code -9" in why, why
    else:
        assert "killed by SIGKILL" in why, why
    everything = store.list_checkpoints("torn", "train", statuses=("committed", "pruned", "quarantined"))
    by_seq = {c.seq: c for c in everything}
    # The retry restored the newest committed checkpoint of the first attempt, and said so.
    first = max(c.seq for c in everything if c.epoch == 1)
    assert first in ((3,) if committed else (2,) if committed is False else (2, 3)), sorted(by_seq)
    restored = [e for e in store.list_events("torn") if e.kind == "task" and e.step == "train"
                and e.to_state == "RUNNING"]
    assert len(restored) == 2
    # Seq 3 of the first attempt: whole and committed, or never there at all.
    torn = f"runs/torn/train/ckpt/{3:08d}-e1"
    if 3 not in by_seq or by_seq[3].epoch != 1:
        assert not storage.exists(f"{torn}/MANIFEST.json") and not storage.listdir(torn), \
            "an uncommitted gang checkpoint was left behind"
    check_output(segue, "torn")


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
    assert proc.returncode == 1 and "world_size=3 but its last checkpoint was written by 2 ranks" in proc.stdout, \
        proc.stdout + proc.stderr
    assert store.get_run("n").state.value == "FAILED"
    t = store.get_task("n", "train")
    assert t.attempts == 2  # not retried: retrying cannot help
    assert "world_size=3 but its last checkpoint was written by 2 ranks" in (t.error or ""), t.error
    assert "--restart-step train" in (t.error or "")


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
