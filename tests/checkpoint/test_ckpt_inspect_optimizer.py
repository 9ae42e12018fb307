"""`segue ckpt inspect` shows the tensors inside an optimizer's state (its per-parameter
state is keyed by int), each with its path, dtype and shape: the real CLI on a real
checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from segue.checkpoint import CheckpointManager

torch = pytest.importorskip("torch", reason="torch is not installed; the optimizer's state is untested")


def inspect(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEGUE_HOME": str(path.parent / "no-home")}
    return subprocess.run([sys.executable, "-m", "segue", "ckpt", "inspect", str(path), *extra],
                          capture_output=True, text=True, timeout=120, env=env)


def test_inspect_lists_every_tensor_of_an_optimizer_state(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
    with CheckpointManager(tmp_path / "m", every_steps=1) as mgr:
        mgr.save(1, {"model": model.state_dict(), "opt": opt.state_dict()}, wait=True)
    proc = inspect(tmp_path / "m")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.strip().split(": ", 1) for line in proc.stdout.splitlines()[1:-1])
    for i, shape in ((0, [2, 4]), (1, [2])):
        for key in ("exp_avg", "exp_avg_sq"):
            assert rows[f"opt.state[{i}].{key}"].startswith(f"tensor float32 {shape} "), rows
        assert rows[f"opt.state[{i}].step"].startswith("tensor float32 [] "), rows
    assert rows["opt.param_groups[0].lr"] == "0.001"
    assert rows["model.weight"].startswith("tensor float32 [2, 4] ")
    doc = json.loads(inspect(tmp_path / "m", "--json").stdout)["tree"]
    assert doc["opt.state[1].exp_avg"].startswith("tensor float32 [2] ")
