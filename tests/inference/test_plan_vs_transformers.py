"""The planner against what transformers really allocates, on CPU (issue 37, item 5).

For random-initialised Llama models of several shapes (MHA, GQA and MQA; head
dims that are and are not ``hidden / heads``; fp32, bf16 and fp16; tied
embeddings; biases), a child process builds the checkpoint with
``save_pretrained``, loads it back as transformers does, and measures:

- the weights: ``numel * element_size`` of every parameter and persistent
  buffer (what ``state_dict`` saves; the rotary ``inv_freq`` buffers are
  recomputed, not weights), a tied tensor counted once;
- the KV cache: the bytes of every layer's key and value tensors in
  ``past_key_values`` after one ``model(input_ids, use_cache=True)`` of
  ``batch x tokens``.

The planner reads the same ``config.json`` (the library for most configs, the
real ``segue plan --json`` process for two) and must give both exactly: the
parameter count, the weights' bytes and the KV cache's bytes. Exact, not within
1%: the biases of a tiny Llama are 0.3-0.7% of its weights, so a tolerance would
hide a planner that forgets them.

This file is also the child's script (``python this_file.py SPECS OUT``); the
pytest process itself never imports torch (see genkit.py on forking after torch).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("torch") is None
        or importlib.util.find_spec("transformers") is None,
        reason="needs torch and transformers (`pip install -e '.[inference]'`)",
    ),
]

# name -> how the child builds it. "tiny": segue.inference.testing.tiny_causal_lm (fp32), then
# re-saved at "dtype"; "config": a LlamaConfig of these fields, saved at "dtype". batch x tokens
# is the forward pass whose cache is measured (and the planner's batch x context).
SPECS: dict[str, dict[str, Any]] = {
    "mha-hd16-fp32": {
        "builder": "tiny",
        "dtype": "fp32",
        "batch": 2,
        "tokens": 5,
        "shape": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "vocab": 300, "seed": 1},
    },
    "gqa-hd32-fp32": {
        "builder": "tiny",
        "dtype": "fp32",
        "batch": 3,
        "tokens": 7,
        "shape": {
            "layers": 3,
            "hidden": 64,
            "heads": 4,
            "kv_heads": 2,
            "head_dim": 32,
            "vocab": 320,
            "seed": 2,
        },
    },
    "mha-hd32-bf16": {
        "builder": "tiny",
        "dtype": "bf16",
        "batch": 1,
        "tokens": 11,
        "shape": {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 4, "vocab": 300, "seed": 3},
    },
    "gqa-hd16-bf16": {
        "builder": "tiny",
        "dtype": "bf16",
        "batch": 4,
        "tokens": 3,
        "shape": {
            "layers": 2,
            "hidden": 64,
            "heads": 8,
            "kv_heads": 2,
            "head_dim": 16,
            "vocab": 300,
            "seed": 4,
            "intermediate": 96,
        },
    },
    # Llama's attention_bias puts a bias on q, k, v *and* o; mlp_bias on gate, up and down.
    "gqa-hd32-fp16-tied-biases": {
        "builder": "config",
        "dtype": "fp16",
        "batch": 2,
        "tokens": 6,
        "config": {
            "num_hidden_layers": 2,
            "hidden_size": 96,
            "num_attention_heads": 6,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "vocab_size": 280,
            "intermediate_size": 160,
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
            "max_position_embeddings": 64,
        },
    },
    "mqa-hd16-fp32-attention-bias": {
        "builder": "config",
        "dtype": "fp32",
        "batch": 3,
        "tokens": 4,
        "config": {
            "num_hidden_layers": 3,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "vocab_size": 260,
            "intermediate_size": 128,
            "attention_bias": True,
            "max_position_embeddings": 64,
        },
    },
}
CLI_SPECS = ("mha-hd16-fp32", "gqa-hd32-fp16-tied-biases")  # planned by the real process
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Build every model and measure it in one child process (a few seconds in all)."""
    root = tmp_path_factory.mktemp("plan-vs-transformers")
    specs = {name: {**spec, "path": str(root / name)} for name, spec in SPECS.items()}
    (root / "specs.json").write_text(json.dumps(specs))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    proc = subprocess.run(
        [sys.executable, __file__, str(root / "specs.json"), str(root / "out.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, dict[str, Any]] = json.loads((root / "out.json").read_text())
    return out


def _planned_by_library(path: str, dtype: str, batch: int, context: int) -> dict[str, Any]:
    from segue.inference import gpus
    from segue.inference.models import load_config
    from segue.inference.plan import Quant, plan

    p = plan(load_config(path), Quant(dtype), gpus.custom(80 * 10**9), context=context, batch=batch)
    return p.to_json()


def _planned_by_cli(path: str, dtype: str, batch: int, context: int, home: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "segue",
            "plan",
            "--model",
            str(Path(path) / "config.json"),
            "--dtype",
            dtype,
            "--batch",
            str(batch),
            "--context",
            str(context),
            "--gpu-mem",
            "80GB",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SEGUE_HOME": str(home)},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


@pytest.mark.parametrize("name", list(SPECS))
def test_planner_gives_what_transformers_allocates(
    name: str, measured: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    spec, got = SPECS[name], measured[name]
    assert got["dtype"] == TORCH_DTYPES[spec["dtype"]]  # the child really loaded that dtype
    args = (got["path"], spec["dtype"], spec["batch"], spec["tokens"])
    doc = (
        _planned_by_cli(*args, home=tmp_path / "home")
        if name in CLI_SPECS
        else _planned_by_library(*args)
    )
    tokens = spec["batch"] * spec["tokens"]
    assert got["kv_shape_tokens"] == tokens  # the cache holds batch x tokens positions per layer
    planned = {
        "params": doc["model"]["params"],
        "weights": doc["breakdown"]["weights"],
        "kv_per_token": doc["kv_bytes_per_token"],
        "kv_cache": doc["breakdown"]["kv_cache"],
    }
    real = {
        "params": got["params"],
        "weights": got["weight_bytes"],
        "kv_per_token": got["kv_bytes"] // tokens,
        "kv_cache": got["kv_bytes"],
    }
    assert got["kv_bytes"] % tokens == 0
    assert planned == real
    assert abs(planned["weights"] - real["weights"]) <= 0.01 * real["weights"]  # issue 37's bar


# --- the child: build, load, forward, measure --------------------------------------------------


def _load_kwargs(dtype: Any) -> dict[str, Any]:
    """``dtype=`` since transformers 4.56 (5.x warns about ``torch_dtype``), ``torch_dtype=`` before."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def _build(spec: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    path, dtype = spec["path"], getattr(torch, TORCH_DTYPES[spec["dtype"]])
    if spec["builder"] == "tiny":
        from segue.inference.testing import tiny_causal_lm

        src = tiny_causal_lm(f"{path}-fp32", **spec["shape"])  # re-saved below at the spec's dtype
        model = AutoModelForCausalLM.from_pretrained(
            str(src), local_files_only=True, **_load_kwargs(dtype)
        )
    else:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**spec["config"])).to(dtype)
    model.save_pretrained(path, safe_serialization=True)


def _kv_tensors(cache: Any) -> list[Any]:
    """Every layer's key and value tensors, whatever the cache API of this transformers."""
    if hasattr(cache, "layers"):  # DynamicCache of transformers >= 4.56: layers[i].keys/.values
        return [t for layer in cache.layers for t in (layer.keys, layer.values)]
    if hasattr(cache, "key_cache"):  # DynamicCache before: parallel lists
        return [*cache.key_cache, *cache.value_cache]
    return [t for kv in cache for t in kv[:2]]  # legacy: a tuple of (key, value) per layer


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        spec["path"], local_files_only=True, **_load_kwargs("auto")
    ).eval()
    params = list(model.parameters())  # a tied tensor once (parameters() dedupes)
    saved = set(model.state_dict())  # persistent buffers are weights; inv_freq is recomputed
    buffers = [t for name, t in model.named_buffers() if name in saved]
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (spec["batch"], spec["tokens"]), generator=gen)
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=True)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = out.past_key_values
    kv = _kv_tensors(cache)
    if len(kv) != 2 * model.config.num_hidden_layers:
        raise AssertionError(f"{len(kv)} cache tensors for {model.config.num_hidden_layers} layers")
    shape_tokens = {t.shape[0] * t.shape[-2] for t in kv}  # (batch, kv_heads, tokens, head_dim)
    if len(shape_tokens) != 1:
        raise AssertionError(f"cache tensors of different lengths: {[tuple(t.shape) for t in kv]}")
    return {
        "path": spec["path"],
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "params": sum(t.numel() for t in params),
        "weight_bytes": sum(t.numel() * t.element_size() for t in [*params, *buffers]),
        "kv_bytes": sum(t.numel() * t.element_size() for t in kv),
        "kv_shape_tokens": shape_tokens.pop(),
    }


def main(specs_path: str, out_path: str) -> None:
    import torch

    torch.set_num_threads(1)
    specs = json.loads(Path(specs_path).read_text())
    out = {}
    for name, spec in specs.items():
        _build(spec)
        out[name] = _measure(spec)
    Path(out_path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
