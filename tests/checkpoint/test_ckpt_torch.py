"""torch tensors round-trip with dtype (bfloat16 too) and device. Needs torch; skipped without."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from segue.checkpoint import CheckpointStorage, LocalStorage, load, save
from segue.checkpoint.tree import decode

torch = pytest.importorskip("torch", reason="torch is not installed; the tensor path is untested")
pytestmark = pytest.mark.torch


@pytest.fixture
def storage(tmp_path: Path) -> CheckpointStorage:
    """Encoding tests need one backend; the storage contract runs the others."""
    return LocalStorage(tmp_path / "root")


DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int64",
    "int32",
    "int16",
    "int8",
    "uint8",
    "bool",
]


def same_tensor(a: Any, b: Any) -> None:
    assert type(b) is torch.Tensor
    assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device)
    assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_tensor_roundtrip(storage: CheckpointStorage, dtype: str) -> None:
    t = (torch.arange(24) - 5).reshape(2, 3, 4).to(getattr(torch, dtype))
    state = {
        "t": t,
        "scalar": torch.tensor(1.5, dtype=getattr(torch, dtype) if dtype != "bool" else torch.bool),
    }
    got = load(storage, save(storage, "c", state).path).state
    same_tensor(t, got["t"])
    same_tensor(state["scalar"], got["scalar"])


def test_bfloat16_is_named_bf16_for_other_readers(storage: CheckpointStorage) -> None:
    from safetensors.torch import load_file

    t = torch.randn(5, 7).to(torch.bfloat16)
    result = save(storage, "c", {"t": t})
    assert load(storage, "c").manifest.arrays["a0"].stored_as == "BF16"
    if storage.local_path("") is None:
        pytest.skip("reads the blob with the reference reader, which needs a local file")
    path = storage.local_path(next(iter(result.files)))
    assert path is not None
    assert torch.equal(load_file(str(path))["a0"], t)


def test_state_dict_of_a_module_roundtrips(storage: CheckpointStorage) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    sd = model.state_dict()
    got = load(storage, save(storage, "c", {"model": sd}).path).state["model"]
    assert list(got) == list(sd)
    for k in sd:
        same_tensor(sd[k], got[k])
    torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).load_state_dict(got)


def test_cuda_tensor_falls_back_to_cpu_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    arrays = {"a0": np.arange(3, dtype=np.float32)}
    meta = {"a0": {"framework": "torch", "dtype": "float32", "device": "cuda:0"}}
    with pytest.warns(
        RuntimeWarning,
        match=r"^tensor was saved on cuda:0 but CUDA is "
        r"unavailable; loaded it on the cpu$",
    ):
        t = decode({"__segue__": "tensor", "ref": "a0"}, arrays, meta, {})
    assert t.device.type == "cpu" and torch.equal(t, torch.arange(3, dtype=torch.float32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensor_comes_back_on_its_device(tmp_path: Path, storage: CheckpointStorage) -> None:
    t = torch.randn(3, 3, device="cuda").to(torch.bfloat16)
    got = load(storage, save(storage, "c", {"t": t}).path).state["t"]
    same_tensor(t, got)
    assert got.device == t.device


def test_optimizer_state_dict_roundtrips_with_groups_and_steps(tmp_path: Path) -> None:
    from segue.checkpoint import CheckpointManager

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(
        [{"params": model[0].parameters(), "lr": 1e-3},
         {"params": model[2].parameters(), "lr": 1e-2, "weight_decay": 0.0}]
    )
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(16, 4)).pow(2).mean().backward()
        opt.step()
    sd = {"model": model.state_dict(), "opt": opt.state_dict()}
    with CheckpointManager(tmp_path, every_steps=1) as mgr:
        mgr.save(3, sd, wait=True)
        step, got = mgr.restore_latest()  # type: ignore[misc]
    assert step == 3
    assert got["opt"]["param_groups"] == sd["opt"]["param_groups"]
    assert list(got["opt"]["state"]) == [0, 1, 2, 3]
    for i, st in sd["opt"]["state"].items():
        for k, v in st.items():
            same_tensor(v, got["opt"]["state"][i][k])  # step counters included
    opt2 = torch.optim.AdamW(
        [{"params": model[0].parameters(), "lr": 0.5}, {"params": model[2].parameters()}]
    )
    opt2.load_state_dict(got["opt"])
    assert opt2.state_dict()["param_groups"][1]["lr"] == 1e-2


def test_standalone_example_resumes_after_a_kill(tmp_path: Path) -> None:
    import re
    import subprocess
    import sys

    example = Path(__file__).parents[2] / "examples" / "standalone_torch.py"
    proc = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "ck")], capture_output=True, text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # killed at step 37: the save of step 30 may still have been in flight (async);
    # every_steps=10 saves at 10, 20, 30 (issue 8, 1.9: it was 11, 21, 31)
    assert re.search(r"^resumed at step (20|30)$", proc.stdout, re.M), proc.stdout
    assert "resumed run equals the uninterrupted run" in proc.stdout
