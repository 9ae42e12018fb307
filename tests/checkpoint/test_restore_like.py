"""``restore(like=template)``: a checkpoint whose state tree differs from the template
(keys, array shapes, dtypes) is refused with one line naming the first differences,
read from the manifest before any tensor byte, and the step fails without a retry.

Every checkpoint here is written through the real engine (``ckpt.save``, a
``StepContext``, or a flow run by the CLI).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from segue_helpers import Segue, wait_for

from segue import checkpoint as ckpt
from segue.checkpoint import CheckpointManager, LocalStorage
from segue.checkpoint.like import check, mismatches
from segue.errors import CheckpointError, CheckpointMismatchError

STATE = {
    "model": {"fc.weight": np.zeros((64, 16), np.float32), "fc.bias": np.zeros(64, np.float32)},
    "opt": {
        "state": {0: {"step": 3, "exp_avg": np.zeros((64, 16), np.float32)}},
        "param_groups": [{"lr": 0.1, "params": [0, 1]}],
    },
    "step": 7,
    "best": None,
    "name": "run",
    "pair": (1, 2.5),
}


def template(**changes: Any) -> dict[str, Any]:
    t = {
        "model": {"fc.weight": np.ones((64, 16), np.float32), "fc.bias": np.ones(64, np.float32)},
        "opt": {
            "state": {0: {"step": 0, "exp_avg": np.ones((64, 16), np.float32)}},
            "param_groups": [{"lr": 0.5, "params": [0, 1]}],
        },
        "step": 0,
        "best": 0.25,
        "name": "other",
        "pair": [0, 0],
    }
    t.update(changes)
    return t


@pytest.fixture
def saved(tmp_path: Path) -> tuple[LocalStorage, ckpt.Manifest]:
    storage = LocalStorage(tmp_path / "root")
    return storage, ckpt.save(storage, "ck", STATE).manifest


def test_a_matching_template_passes(saved: tuple[LocalStorage, ckpt.Manifest]) -> None:
    # Values differ everywhere; keys, shapes, dtypes and kinds match. int/float are both
    # numbers, a tuple matches a list, None on either side matches anything.
    _, manifest = saved
    assert mismatches(manifest, template()) == []
    assert mismatches(manifest, template(best=None, step=0.0, pair=(None, 3))) == []
    assert mismatches(manifest, template(step=np.int64(0))) == []
    od = OrderedDict(template())
    assert mismatches(manifest, od) == []


def test_missing_extra_shape_dtype_and_kind(saved: tuple[LocalStorage, ckpt.Manifest]) -> None:
    _, manifest = saved
    t = template()
    del t["opt"]["param_groups"]
    t["model"]["fc.weight"] = np.ones((64, 32), np.float32)
    t["model"]["fc.bias"] = np.ones(64, np.float64)
    t["model"]["head.weight"] = np.ones(3, np.float32)
    t["opt"]["state"] = {0: {"step": 0, "exp_avg": np.ones((64, 16), np.float32)}, 1: {}}
    t["name"] = 3
    t["step"] = {"epoch": 0}
    t["pair"] = [0, 0, 0]
    assert mismatches(manifest, t) == [
        "model.fc.weight shape (64, 16) != (64, 32)",
        "model.fc.bias dtype float32 != float64",
        "model.head.weight missing",
        "opt.state[1] missing",
        "opt.param_groups not in the template",
        "step number != dict",
        "name str != number",
        "pair length 2 != 3",
    ]
    assert mismatches(manifest, template(opt={"state": {}, "param_groups": []})) == []
    assert mismatches(manifest, {"model": np.zeros(2)}) == [
        "model dict != numpy array (2,)",
        "opt not in the template",
        "step not in the template",
        "best not in the template",
        "name not in the template",
        "pair not in the template",
    ]
    assert mismatches(manifest, []) == ["the state dict != list"]


def test_the_error_is_one_line_naming_the_first_mismatches(
    saved: tuple[LocalStorage, ckpt.Manifest],
) -> None:
    _, manifest = saved
    t = template(model={"fc.weight": np.ones((64, 32), np.float32)}, step="x", extra=1)
    with pytest.raises(CheckpointMismatchError) as info:
        check(manifest, t, name="checkpoint ck", fix="restore without like=")
    assert str(info.value) == (
        "checkpoint ck does not match the template: model.fc.weight shape (64, 16) != (64, 32); "
        "model.fc.bias not in the template; step number != str; +1 more; restore without like="
    )
    assert info.value.mismatches[-1] == "extra missing"
    assert isinstance(info.value, CheckpointError) and info.value.segue_retryable is False


def test_torch_state_dicts(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    storage = LocalStorage(tmp_path / "root")
    model = torch.nn.Linear(16, 64)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 16)).sum().backward()
    opt.step()
    manifest = ckpt.save(
        storage, "ck", {"model": model.state_dict(), "opt": opt.state_dict()}
    ).manifest

    same = torch.nn.Linear(16, 64)
    same_opt = torch.optim.Adam(same.parameters())
    same(torch.ones(2, 16)).sum().backward()
    same_opt.step()
    assert mismatches(manifest, {"model": same.state_dict(), "opt": same_opt.state_dict()}) == []

    wider = torch.nn.Linear(32, 64).to(torch.bfloat16)
    assert mismatches(manifest, {"model": wider.state_dict(), "opt": same_opt.state_dict()}) == [
        "model.weight shape (64, 16) != (64, 32)",
        "model.weight dtype float32 != bfloat16",
        "model.bias dtype float32 != bfloat16",
    ]
    # A fresh optimizer has no per-parameter state yet: an empty dict in the template
    # matches any dict, so a template built before the first step passes.
    fresh = torch.optim.Adam(same.parameters()).state_dict()
    assert fresh["state"] == {}
    assert mismatches(manifest, {"model": same.state_dict(), "opt": fresh}) == []
    fresh["param_groups"][0]["params"] = [0]
    assert mismatches(manifest, {"model": same.state_dict(), "opt": fresh}) == [
        "opt.param_groups[0].params length 2 != 1"
    ]
    assert mismatches(
        manifest,
        {
            "model": {k: v.numpy() for k, v in same.state_dict().items()},
            "opt": same_opt.state_dict(),
        },
    ) == ["model.weight torch tensor != numpy array", "model.bias torch tensor != numpy array"]


def test_manager_restore_latest_like(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path / "ck", every_steps=1) as mgr:
        mgr.save(3, STATE, wait=True)
        got = mgr.restore_latest(like=template())
        assert got is not None and got[0] == 3 and got[1]["step"] == 7
        with pytest.raises(
            CheckpointMismatchError,
            match=(
                r"^checkpoint checkpoints/step-0000000003 does not match the template: "
                r"model.fc.bias dtype float32 != int8; restore without like= to get the state "
                r"as saved, or save to a new prefix$"
            ),
        ):
            mgr.restore_latest(
                like=template(
                    model={
                        "fc.weight": np.ones((64, 16), np.float32),
                        "fc.bias": np.ones(64, np.int8),
                    }
                )
            )
        assert mgr.steps() == [3]  # a mismatch is not corruption: nothing was quarantined


FLOW = """
import time
import numpy as np
from segue import Flow

HIDDEN = 16
flow = Flow("like", params={"ready": ""})


@flow.step(retries=5)
def train(ctx):
    like = {"w": np.zeros((HIDDEN, 4), np.float32), "i": 0}
    state = ctx.restore(like=like)
    if state is None:
        state = like
        ctx.checkpoint(state, durable=True)
        open(ctx.params["ready"], "w").close()
        while not ctx.pause_requested:  # the test pauses the run once the file exists
            time.sleep(0.01)
        ctx.checkpoint(state)  # parks
    return {"rows": int(state["w"].shape[0])}
"""


def test_step_context_checks_the_manifest_before_reading_a_tensor(tmp_path: Path) -> None:
    from segue.home import Home
    from segue.run import ops
    from segue.run.context import Flags, StepContext
    from segue.states import Actor, TaskState

    flow = tmp_path / "like.py"
    flow.write_text(FLOW)
    home = Home.resolve(tmp_path / "home")
    store = home.open_store()
    prepared = ops.prepare_run(str(flow), {}, run_id="q")
    ops.create_run(store, prepared)
    spec = prepared.loaded.flow.steps["train"]

    def attempt() -> StepContext:
        task = store.start_attempt("q", "train", ttl_s=60, actor=Actor.CONTROLLER)
        return StepContext(
            run_id="q",
            spec=spec,
            params=prepared.params,
            epoch=task.epoch,
            attempt=task.attempts,
            store=store,
            storage=home.storage(),
            flags=Flags(),
            load_input=lambda name: None,
            code_fingerprint="x",
            home=home,
        )

    ctx = attempt()
    assert ctx.restore(like={"w": np.zeros((16, 4), np.float32)}) is None  # first start
    ctx.checkpoint({"w": np.arange(64, dtype=np.float32).reshape(16, 4), "i": 5}, durable=True)
    ctx.close()
    store.transition_task(
        "q",
        "train",
        TaskState.RETRYING,
        actor=Actor.CONTROLLER,
        epoch=ctx.epoch,
        reason="test",
        next_attempt_at=0.0,
    )

    ctx = attempt()
    got = ctx.restore(like={"w": np.zeros((16, 4), np.float32), "i": 0})
    assert got["i"] == 5 and got["w"][3, 1] == 13.0

    # Rot every blob: a restore that read a tensor would quarantine the checkpoint and
    # fail with NoValidCheckpointError. A mismatching template is refused from the
    # manifest first, and the checkpoint stays committed.
    (rec,) = store.list_checkpoints("q", "train")
    manifest = ckpt.read_manifest(home.storage(), rec.path)
    for name in manifest.files:
        blob = Path(home.storage().root) / name
        blob.chmod(0o644)
        blob.write_bytes(b"\0" * blob.stat().st_size)
    with pytest.raises(
        CheckpointMismatchError,
        match=(
            r"^checkpoint 1 of step 'train' does not match the template: w shape \(16, 4\) != "
            r"\(32, 4\); restore without like= to get the state as saved, or start the step over "
            r"with `segue resume q --restart-step train`$"
        ),
    ):
        ctx.restore(like={"w": np.zeros((32, 4), np.float32), "i": 0})
    assert [c.status for c in store.list_checkpoints("q", "train")] == ["committed"]


def test_a_changed_model_fails_the_run_without_a_retry(segue: Segue, tmp_path: Path) -> None:
    flow, ready = tmp_path / "like.py", tmp_path / "ready"
    flow.write_text(FLOW)
    run = "lk"
    segue("run", str(flow), "--run-id", run, "--detach", "-p", f"ready={ready}", check=True)
    wait_for(ready.exists, 180, "the first checkpoint")
    assert segue("pause", run, "--wait", "--timeout", "120").returncode == 0
    assert segue.status(run)["state"] == "PAUSED"

    flow.write_text(FLOW.replace("HIDDEN = 16", "HIDDEN = 32"))
    proc = segue("resume", run, "--allow-code-change", timeout=300)
    assert proc.returncode == 1, proc.stderr
    doc = segue.status(run)
    assert doc["state"] == "FAILED"
    step = segue.step(run, "train")
    assert step["attempts"] == 2  # retries=5, yet no retry: the same checkpoint would fail again
    # Checkpoint 2 is the one the pause parked at.
    assert step["error"] == (
        "CheckpointMismatchError: checkpoint 2 of step 'train' does not match the template: "
        "w shape (16, 4) != (32, 4); restore without like= to get the state as saved, or start "
        f"the step over with `segue resume {run} --restart-step train`"
    )
    assert step["failures"] == 1
    assert any((e.get("reason") or "").endswith("; not retryable") for e in segue.events(run))


def test_pickled_values_numpy_scalars_and_generators(tmp_path: Path) -> None:
    from decimal import Decimal
    from fractions import Fraction

    storage = LocalStorage(tmp_path / "root")
    state = {
        "f": Fraction(1, 3),
        "g": np.random.default_rng(1),
        "u": np.str_("a"),
        "b": np.bytes_(b"x"),
        "x": np.float32(1.5),
        "raw": b"\x00",
    }
    manifest = ckpt.save(storage, "ck", state, allow_pickle=True).manifest
    like = {
        "f": Fraction(2, 3),
        "g": np.random.default_rng(2),
        "u": "b",
        "b": b"y",
        "x": 2,
        "raw": b"",
    }
    assert mismatches(manifest, like) == []
    assert mismatches(manifest, {**like, "f": Decimal(1), "g": 0, "u": b"b", "raw": "s"}) == [
        "f fractions.Fraction != decimal.Decimal",
        "g generator != number",
        "u str != bytes",
        "raw bytes != str",
    ]
