"""A training step's data loader resumes mid-epoch with the same batches after SIGKILLs.

tests/flows/torchloader.py trains over 200 shuffled records in batches of 8 (25 a
epoch) with 2 loader workers, checkpointing every 5 steps with the loader itself in
the state. Its attempt is SIGKILLed twice: at step 13 (last checkpoint at 10: mid
epoch, with the workers' prefetch already past it) and at step 27 (last checkpoint at
25: the epoch's last batch, before its iterator ended). Every batch any attempt
trained on must be the uninterrupted run's batch at that step (the redone ones too),
each resume must start right after its checkpoint, and the weights (dropout draws
from torch's global RNG every step) must be bit-identical.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import FLOWS, Segue, wait_for

from segue.home import Home

pytestmark = pytest.mark.torch
FLOW = str(FLOWS / "torchloader.py")
KILLS = ((13, 10), (27, 25))  # (the step the kill lands at, the step of the last checkpoint)


def batches(log: Path) -> list[list[dict[str, Any]]]:
    """Per attempt, in attempt order: the batches it trained on."""
    return [[json.loads(line) for line in f.read_text().splitlines()]
            for f in sorted(log.glob("epoch-*.jsonl"))]


def sigkills(segue: Segue, run: str) -> int:
    """SIGKILLs of workers the failure detector recorded: kills that landed."""
    return sum("killed by SIGKILL" in e["reason"] for e in segue.events(run)
               if e["actor"] == "failure-detector" and e["kind"] == "task")


def needs(kind: str) -> None:
    pytest.importorskip("torch", reason="torch is not installed: pip install 'segue[torch]'")
    if kind == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader",
                            reason="torchdata is not installed: pip install 'segue[torch]'")


@pytest.mark.parametrize("kind", ["stateful", "resumable"])
def test_loader_resumes_mid_epoch_bit_exact(segue: Segue, tmp_path: Path, kind: str) -> None:
    needs(kind)
    ref_log, log = tmp_path / "ref_log", tmp_path / "log"
    ref_log.mkdir()
    log.mkdir()
    ref = Segue(segue.home.parent / "ref")
    ref("run", FLOW, "--run-id", "r", "-p", f"loader={kind}", "-p", f"log={ref_log}", check=True)
    [expected] = batches(ref_log)
    assert [b["step"] for b in expected] == list(range(1, 51))
    by_step = {b["step"]: b for b in expected}

    holds = {at: tmp_path / f"hold-{at}" for at, _ in KILLS}
    run = "t"
    segue("run", FLOW, "--run-id", run, "--detach", "-p", f"loader={kind}", "-p", f"log={log}",
          "-p", "holds=" + ",".join(f"{at}={p}" for at, p in holds.items()), check=True)
    store = Home.resolve(segue.home).open_store()

    def at_gate(at: int, ckpt_step: int) -> int | None:
        """The pid of the attempt that trained step ``at`` and committed step ``ckpt_step``."""
        t = store.get_task(run, "train")
        mine = [c for c in store.list_checkpoints(run, "train") if c.epoch == t.epoch]
        attempts = batches(log)
        if (t.state.value == "RUNNING" and t.pid and attempts and attempts[-1]
                and attempts[-1][-1]["step"] == at
                and any(c.position.get("steps") == ckpt_step for c in mine)):
            return t.pid
        return None

    for landed, (at, ckpt_step) in enumerate(KILLS, 1):
        # Gate on observed progress: the attempt waits at `at`, its checkpoint committed.
        pid = wait_for(lambda: at_gate(at, ckpt_step), 120, f"train to wait at step {at}")
        os.kill(pid, signal.SIGKILL)  # it waits for the hold file: the kill lands here
        wait_for(lambda: sigkills(segue, run) >= landed, 60, "the kill to be recorded")
        holds[at].write_text("go")
    segue.wait_state(run, {"SUCCEEDED"}, 180)
    assert sigkills(segue, run) == len(KILLS)

    attempts = batches(log)
    assert len(attempts) == len(KILLS) + 1, [len(a) for a in attempts]
    # Each resume starts right after the checkpoint it restored: no skip-ahead by hand.
    assert [a[0]["step"] for a in attempts] == [1] + [ckpt + 1 for _, ckpt in KILLS]
    assert [a[-1]["step"] for a in attempts] == [at for at, _ in KILLS] + [50]
    for a in attempts:  # the redone batches too
        for b in a:
            assert b == by_step[b["step"]], f"step {b['step']}: {b} != {by_step[b['step']]}"
    # The last attempt covers the uninterrupted run from its checkpoint on, in order.
    assert attempts[-1] == expected[KILLS[-1][1]:]

    want, got = ref.output("r", "train"), segue.output(run, "train")
    assert set(want) == set(got)
    for k in want:
        assert np.isfinite(want[k]).all(), f"{k}: the reference run diverged"
        np.testing.assert_array_equal(want[k], got[k])
        assert want[k].tobytes() == got[k].tobytes()
