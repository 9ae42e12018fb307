"""The GPU memory planner (`segue plan`, segue.inference.plan) against published figures.

Pure arithmetic: no GPU, no torch. The CLI tests run the real `python -m segue`.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from segue.errors import UsageError
from segue.inference import gpus
from segue.inference.models import PRESETS, from_flags, load_config, preset
from segue.inference.plan import (
    Assumptions,
    Fit,
    Quant,
    fit_profile,
    kv_bytes_per_token,
    plan,
    plan_from_profile,
    plan_profile,
    predict_peak_bytes,
)
from segue.placement.pricing import CATALOG as PRICE_CATALOG

KIB = 1024

# config.json of each preset, as published on the Hugging Face hub (fields that
# do not matter to the planner, such as rope scaling, left out).
LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "attention_bias": False, "hidden_act": "silu",
            "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
            "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
            "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 128256}
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": LLAMA_8B,
    "llama-3.1-70b": {**LLAMA_8B, "hidden_size": 8192, "intermediate_size": 28672,
                      "num_attention_heads": 64, "num_hidden_layers": 80},
    "qwen2.5-72b": {"architectures": ["Qwen2ForCausalLM"], "hidden_act": "silu", "hidden_size": 8192,
                    "intermediate_size": 29568, "max_position_embeddings": 32768,
                    "model_type": "qwen2", "num_attention_heads": 64, "num_hidden_layers": 80,
                    "num_key_value_heads": 8, "sliding_window": 131072, "tie_word_embeddings": False,
                    "use_sliding_window": False, "vocab_size": 152064},
    "mixtral-8x7b": {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
                     "intermediate_size": 14336, "max_position_embeddings": 32768,
                     "model_type": "mixtral", "num_attention_heads": 32, "num_experts_per_tok": 2,
                     "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                     "sliding_window": None, "tie_word_embeddings": False, "vocab_size": 32000},
    "all-minilm-l6-v2": {"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": 384,
                         "intermediate_size": 1536, "max_position_embeddings": 512,
                         "model_type": "bert", "num_attention_heads": 12, "num_hidden_layers": 6,
                         "pad_token_id": 0, "type_vocab_size": 2, "use_cache": True,
                         "vocab_size": 30522},
}


def write_config(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(doc))
    return d / "config.json"


# --- KV cache: the published per-token figures -------------------------------------------------


def test_llama_3_1_8b_kv_cache_is_128_kib_per_token_in_bf16() -> None:
    # 2 (K and V) * 32 layers * 8 KV heads * 128 head_dim * 2 bytes
    assert kv_bytes_per_token(preset("llama-3.1-8b"), "bf16") == 2 * 32 * 8 * 128 * 2 == 131072
    p = plan(preset("llama-3.1-8b"), "bf16", gpus.gpu("h100"), context=8192, batch=1)
    assert p.kv_bytes_per_token == 128 * KIB
    assert p.memory.kv_cache == 8192 * 128 * KIB  # exactly 1 GiB for one 8192-token sequence


def test_llama_3_1_70b_kv_cache_is_320_kib_per_token_in_bf16() -> None:
    assert kv_bytes_per_token(preset("llama-3.1-70b"), "bf16") == 2 * 80 * 8 * 128 * 2 == 320 * KIB


def test_fp8_kv_cache_halves_the_bf16_figure() -> None:
    m = preset("llama-3.1-8b")
    assert kv_bytes_per_token(m, Quant("bf16", kv_dtype="fp8")) == 64 * KIB
    assert Quant("fp8").kv_dtype == "bf16" and Quant("int4").kv_dtype == "bf16"  # quantized: bf16
    assert Quant("fp16").kv_dtype == "fp16"


def test_gqa_kv_uses_kv_heads_times_head_dim_never_hidden_size() -> None:
    # A planner that took hidden_size for K and V (multi-head attention) would say 512 KiB
    # for Llama-3.1-8B: four times too much, since 8 KV heads serve 32 query heads.
    m = preset("llama-3.1-8b")
    mha_figure = 2 * m.layers * m.hidden * 2
    assert mha_figure == 512 * KIB
    assert kv_bytes_per_token(m) != mha_figure
    assert kv_bytes_per_token(m) * (m.heads // m.kv_heads) == mha_figure
    mha = load_config_doc({**LLAMA_8B, "num_key_value_heads": 32})  # the same model without GQA
    assert kv_bytes_per_token(mha) == mha_figure


def test_an_encoder_has_no_kv_cache() -> None:
    p = plan(preset("all-minilm-l6-v2"), "fp32", gpus.gpu("l4"), context=256, batch=64)
    assert p.kv_bytes_per_token == 0 and p.memory.kv_cache == 0
    assert p.throughput is not None and p.throughput.kind == "encode"


def load_config_doc(doc: dict[str, Any]) -> Any:
    from segue.inference.models import model_from_config

    return model_from_config(doc)


# --- config.json gives what the preset gives ----------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_gives_the_presets_figures(tmp_path: Path, name: str) -> None:
    from_file = load_config(write_config(tmp_path, name, CONFIGS[name]))
    built_in = preset(name)
    assert from_file.params == built_in.params  # the estimate reproduces the published count
    assert from_file.source == "config.json" and from_file.name == name
    for dtype in ("bf16", "fp8", "int4"):
        ctx = 256 if built_in.encoder else 8192
        a = plan(from_file, dtype, gpus.gpu("h200"), context=ctx, batch=4).to_json()
        b = plan(built_in, dtype, gpus.gpu("h200"), context=ctx, batch=4).to_json()
        for k in ("kv_bytes_per_token", "breakdown", "total_bytes", "fits", "max_batch",
                  "max_context", "throughput"):
            assert a[k] == b[k], (name, dtype, k)


def test_published_parameter_counts() -> None:
    assert {n: m.params for n, m in PRESETS.items()} == {
        "llama-3.1-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496,
        "qwen2.5-72b": 72_706_203_648, "mixtral-8x7b": 46_702_792_704,
        "all-minilm-l6-v2": 22_713_216}
    assert round(preset("mixtral-8x7b").active_params / 1e9, 1) == 12.9  # 2 of 8 experts


def test_config_defaults_kv_heads_and_head_dim_and_reads_a_directory(tmp_path: Path) -> None:
    doc = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    m = load_config(write_config(tmp_path, "mha", doc).parent)  # a directory holding config.json
    assert m.kv_heads == m.heads == 32 and m.head_dim == 4096 // 32


# --- fits or not --------------------------------------------------------------------------------


def test_llama_70b_bf16_does_not_fit_one_h200() -> None:
    p = plan(preset("llama-3.1-70b"), "bf16", gpus.gpu("h200"), context=8192, batch=1)
    assert p.memory.weights == 2 * 70_553_706_496  # ~141 GB of bf16 weights
    assert not p.fits and p.max_batch == 0 and p.max_context == 0
    assert p.total_bytes > p.capacity_bytes == 143771 * 2**20


def test_llama_70b_fp8_fits_an_rtx_pro_6000_at_batch_1_and_8192_tokens() -> None:
    p = plan(preset("llama-3.1-70b"), "fp8", gpus.gpu("rtx-pro-6000"), context=8192, batch=1)
    # 68.45B linear weights at 1 byte + 2.10B embedding and LM-head weights at 2 bytes
    assert p.memory.weights == 68_452_360_192 + 2 * 2_101_346_304
    assert p.fits and p.total_bytes <= p.capacity_bytes
    assert p.max_batch >= 1 and p.max_context >= 32768  # ~54k tokens of bf16 KV fit beside it
    assert not plan(preset("llama-3.1-70b"), "fp8", gpus.gpu("rtx-pro-6000"),
                    context=65536, batch=1).fits


# --- quantization metadata and tensor parallelism ----------------------------------------------


def test_int4_group_size_metadata_arithmetic() -> None:
    m = from_flags(layers=32, hidden=4096, kv_heads=8, head_dim=128, vocab=32000,
                   params=7_000_000_000)
    emb = 2 * 32000 * 4096  # untied embeddings and LM head: kept at 16 bits
    quantized = 7_000_000_000 - emb
    p = plan(m, Quant("int4", group_size=128), gpus.gpu("h100"), context=1, batch=1)
    assert p.memory.weights == math.ceil(quantized * 0.5 + emb * 2)
    assert p.memory.quant_metadata == math.ceil(quantized / 128) * (2 + 2)  # fp16 scale + zero
    # int4 at group 128 costs 4 + 32/128 = 4.25 bits per quantized weight
    assert (p.memory.weights - emb * 2 + p.memory.quant_metadata) * 8 / quantized == \
        pytest.approx(4.25, abs=1e-6)
    p8 = plan(m, Quant("int8", group_size=64), gpus.gpu("h100"), context=1, batch=1)
    assert p8.memory.quant_metadata == math.ceil(quantized / 64) * 4
    assert plan(m, "int4", gpus.gpu("h100"), context=1, batch=1).memory.quant_metadata == 0
    with pytest.raises(UsageError, match=r"^--group-size applies to int4 and int8 weights, not bf16$"):
        Quant("bf16", group_size=128)
    with pytest.raises(UsageError, match=r"^group size must be an integer >= 1, not 0$"):
        Quant("int4", group_size=0)


def test_tensor_parallelism_splits_weights_and_kv_heads() -> None:
    m, h100 = preset("llama-3.1-70b"), gpus.gpu("h100")
    one = plan(m, "bf16", h100, context=8192, batch=8, tp=1)
    four = plan(m, "bf16", h100, context=8192, batch=8, tp=4)
    assert four.memory.weights == math.ceil(one.memory.weights / 4)
    assert four.kv_bytes_per_token == one.kv_bytes_per_token == 320 * KIB  # the model's figure
    assert four.kv_bytes_per_token_per_device == 80 * KIB  # 2 of the 8 KV heads per device
    assert four.memory.kv_cache == one.memory.kv_cache // 4
    assert not one.fits and four.fits
    assert four.memory.cuda_context == one.memory.cuda_context  # every device has its own
    # 16 devices, 8 KV heads: each KV head is replicated on two devices (as vLLM does)
    assert plan(m, "bf16", h100, context=8192, batch=1, tp=16).kv_bytes_per_token_per_device == \
        2 * 80 * 1 * 128 * 2
    with pytest.raises(UsageError, match=r"^--tp 3 does not divide the 64 attention heads of "
                                         r"llama-3\.1-70b; use a divisor of 64$"):
        plan(m, "bf16", h100, context=8192, tp=3)
    with pytest.raises(UsageError, match=r"^tp must be an integer >= 1, not 0$"):
        plan(m, "bf16", h100, context=8192, tp=0)


# --- the largest batch and the longest context -------------------------------------------------

CASES = [("llama-3.1-8b", "bf16", "l4", 1), ("llama-3.1-8b", "bf16", "h100", 1),
         ("llama-3.1-70b", "fp8", "rtx-pro-6000", 1), ("mixtral-8x7b", "bf16", "h200", 1),
         ("qwen2.5-72b", "int4", "h100", 2), ("all-minilm-l6-v2", "fp32", "l4", 1)]


@pytest.mark.parametrize(("name", "dtype", "gpu", "tp"), CASES)
def test_max_batch_and_max_context_are_exact_edges(name: str, dtype: str, gpu: str, tp: int) -> None:
    m, g = preset(name), gpus.gpu(gpu)
    ctx = 256 if m.encoder else 4096
    p = plan(m, dtype, g, context=ctx, batch=2, tp=tp)
    assert p.max_batch >= 1
    assert plan(m, dtype, g, context=ctx, batch=p.max_batch, tp=tp).fits
    assert not plan(m, dtype, g, context=ctx, batch=p.max_batch + 1, tp=tp).fits
    assert plan(m, dtype, g, context=p.max_context, batch=2, tp=tp).fits
    if p.max_context_limit == "memory":
        assert not plan(m, dtype, g, context=p.max_context + 1, batch=2, tp=tp).fits
    else:
        assert p.max_context == m.max_position


@pytest.mark.parametrize(("name", "dtype", "gpu", "tp"), CASES)
def test_max_batch_and_max_context_shrink_monotonically(name: str, dtype: str, gpu: str,
                                                        tp: int) -> None:
    m, g = preset(name), gpus.gpu(gpu)
    contexts = [64, 128, 256, 512] if m.encoder else [1024, 4096, 8192, 32768]
    batches = [p.max_batch for p in (plan(m, dtype, g, context=c, tp=tp) for c in contexts)]
    assert batches == sorted(batches, reverse=True)
    longest = [plan(m, dtype, g, context=128, batch=b, tp=tp).max_context for b in (1, 2, 8, 32)]
    assert longest == sorted(longest, reverse=True)


def test_the_total_is_the_sum_of_the_breakdown_against_the_capacity() -> None:
    p = plan(preset("llama-3.1-8b"), "bf16", gpus.gpu("l4"), context=8192, batch=8,
             assumptions=Assumptions(cuda_context_bytes=500 * 2**20, slack=0.05))
    b = p.to_json()["breakdown"]
    assert p.total_bytes == sum(b.values())
    assert b["slack"] == math.ceil(0.05 * p.capacity_bytes) and b["cuda_context"] == 500 * 2**20
    assert p.fits == (p.total_bytes <= p.capacity_bytes)


# --- roofline and cost --------------------------------------------------------------------------


def test_decode_roofline_reads_weights_and_the_batchs_kv_per_step() -> None:
    m = preset("llama-3.1-8b")
    p = plan(m, "bf16", gpus.gpu("h100"), context=8192, batch=4, price_per_hour=9.80)
    t = p.throughput
    assert t is not None and t.kind == "decode" and t.bound == "memory"
    assert t.bytes_per_step == 2 * m.params + 4 * 8192 * 128 * KIB
    assert t.per_sequence_per_s == pytest.approx(3350e9 / t.bytes_per_step)
    assert t.per_s == pytest.approx(4 * t.per_sequence_per_s)
    assert t.cost == pytest.approx(9.80 / 3600 / t.per_s * 1e6)


def test_moe_decode_reads_only_the_experts_the_batch_touches() -> None:
    m = preset("mixtral-8x7b")
    one = plan(m, "bf16", gpus.gpu("h200"), context=1, batch=1).throughput
    assert one is not None  # batch 1: 2 of 8 experts a layer
    dense = 2 * m.params
    assert one.bytes_per_step == pytest.approx(dense - 2 * m.expert_params * 0.75 + 2 * 32 * 8 * 128 * 2,
                                               rel=1e-9)


# --- predict_peak_bytes (bench-model draws it beside its measurements) -------------------------


def test_predict_peak_bytes_of_an_encoder() -> None:
    m = preset("all-minilm-l6-v2")
    got = predict_peak_bytes(m, batch=32, seq_len=128, quant="fp32")
    weights = 4 * m.params
    tokens = 32 * 128
    acts = tokens * 4 * (2 * 384 + 3 * 384 + 2 * 1536) + 32 * 12 * 128 * 128 * 4
    assert got == weights + acts
    assert predict_peak_bytes(m, batch=64, seq_len=128, quant="fp32") > got


def test_predict_peak_bytes_of_a_decoder_is_the_plan_without_context_and_slack() -> None:
    m = preset("llama-3.1-8b")
    p = plan(m, "bf16", gpus.gpu("h100"), context=512, batch=2,
             assumptions=Assumptions(prefill_chunk=None))
    mem = p.memory
    assert predict_peak_bytes(m, batch=2, seq_len=512) == \
        mem.weights + mem.quant_metadata + mem.kv_cache + mem.activations


# --- measured profiles --------------------------------------------------------------------------


def profile(batches: list[tuple[int, int]], **extra: Any) -> dict[str, Any]:
    return {"v": 1, "handler": "minilm", "version": "1", "device": "cuda:0", "device_type": "h200",
            "device_name": "NVIDIA H200", "capacity_bytes": 150_000_000_000, "load_s": 1.2,
            "memory_after_load_bytes": 120_000_000,
            "batches": [{"batch_size": b, "peak_bytes": y, "first_batch_s": 0.05,
                         "items_per_s": 100.0 * b, "p50_s": 0.01, "p95_s": 0.012,
                         "cost_per_1k_items": 0.003} for b, y in batches],
            "recommended_batch_size": 64, "price_per_hour": 10.6, "created_at": 1796000000.0,
            **extra}


def test_fit_recovers_an_exact_line() -> None:
    base, slope = 123_000_000, 2_500_000
    fit = fit_profile(profile([(b, base + slope * b) for b in (1, 8, 32, 128)]))
    assert fit.base_bytes == pytest.approx(base, rel=1e-12)
    assert fit.slope_bytes_per_item == pytest.approx(slope, rel=1e-12)
    assert fit.points == 4 and fit.peak_bytes(256) == base + slope * 256


def test_fit_of_one_point_goes_through_the_memory_after_load() -> None:
    fit = fit_profile(profile([(8, 130_000_000)]))
    assert fit.base_bytes == 120_000_000 and fit.slope_bytes_per_item == 1_250_000
    with pytest.raises(UsageError, match=r"^profile has one batch size and no "
                                         r"memory_after_load_bytes; .*`segue bench-model`$"):
        fit_profile(profile([(8, 130_000_000)], memory_after_load_bytes=None))


def test_plan_from_profile_finds_the_largest_batch_under_capacity_less_slack() -> None:
    p = profile([(1, 1_002_000_000), (16, 1_032_000_000)])  # 1 GB + 2 MB per item
    n = plan_from_profile(p, 10_000_000_000, slack=0.10)
    fit = fit_profile(p)
    assert fit.peak_bytes(n) <= 9_000_000_000 < fit.peak_bytes(n + 1)
    assert n == 4000
    pp = plan_profile(p, 10_000_000_000, batch=16, price_per_hour=3.6)
    assert pp.method == "profile" and pp.max_batch == 4000 and pp.fits
    assert pp.measured_batch == 16 and pp.items_per_s == 1600.0
    assert pp.extrapolated and pp.largest_measured == 16 and pp.to_json()["extrapolated"] is True
    assert pp.cost_per_1k_items == pytest.approx(3.6 / 3600 / 1600 * 1000)
    assert Fit(2e10, 1.0).max_batch(10_000_000_000) == 0  # the base alone does not fit


@pytest.mark.parametrize(("doc", "pattern"), [
    (profile([(8, 1)], v=2), r"^profile has version 2, not 1; .*bench-model`$"),
    (profile([]), r"^profile has no measured batches; .*bench-model`$"),
])
def test_bad_profiles_are_one_line_usage_errors(doc: dict[str, Any], pattern: str) -> None:
    with pytest.raises(UsageError, match=pattern) as info:
        fit_profile(doc)
    assert "\n" not in str(info.value)


# --- bad input ----------------------------------------------------------------------------------


def test_unknown_model_lists_the_presets() -> None:
    with pytest.raises(UsageError, match=r"^unknown model 'gpt-5'; use a preset \(llama-3\.1-8b, "
                                         r"llama-3\.1-70b, qwen2\.5-72b, mixtral-8x7b, "
                                         r"all-minilm-l6-v2\), a path to a Hugging Face "
                                         r"config\.json, or the --layers/--hidden/\.\.\. flags$"):
        preset("gpt-5")
    assert preset("meta-llama/Llama-3.1-8B-Instruct") is PRESETS["llama-3.1-8b"]


def test_unknown_gpu_lists_the_catalog() -> None:
    with pytest.raises(UsageError, match=r"^unknown GPU 'tpu-v5'; use one of "
                                         r"rtx-pro-6000-blackwell, l4, a100-40gb, a100-80gb, "
                                         r"h100, h200, b200 \(or rtx-pro-6000\), or give "
                                         r"--gpu-mem SIZE$"):
        gpus.gpu("tpu-v5")


def test_gpu_catalog_matches_the_price_catalog_and_names() -> None:
    priced = {e.key for e in PRICE_CATALOG if e.unit == "device-hour"} - {"virtual", "gpu"}
    assert set(gpus.CATALOG) == priced
    assert gpus.gpu("rtx-pro-6000").key == "rtx-pro-6000-blackwell"
    assert gpus.gpu("NVIDIA H100 80GB HBM3").key == "h100"
    assert gpus.gpu("NVIDIA A100-SXM4-80GB").key == "a100-80gb"
    assert gpus.gpu("H200").bandwidth == 4800e9
    assert gpus.custom(48 * 10**9).capacity_bytes == 48 * 10**9


@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"batch": -1}, r"^batch must be an integer >= 1, not -1$"),
    ({"batch": 0}, r"^batch must be an integer >= 1, not 0$"),
    ({"context": 0}, r"^context must be an integer >= 1, not 0$"),
])
def test_bad_batch_or_context(kwargs: dict[str, int], pattern: str) -> None:
    args = {"context": 8192, "batch": 1, **kwargs}
    with pytest.raises(UsageError, match=pattern):
        plan(preset("llama-3.1-8b"), "bf16", gpus.gpu("l4"), **args)


def test_bad_dtypes() -> None:
    with pytest.raises(UsageError, match=r"^unknown dtype 'int3'; use one of fp32, bf16, fp16, "
                                         r"fp8, int8, int4$"):
        Quant("int3")
    with pytest.raises(UsageError, match=r"^unknown KV-cache dtype 'int4'; use one of fp32, bf16, "
                                         r"fp16, fp8, int8$"):
        Quant("bf16", kv_dtype="int4")


def test_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^no config\.json at '.*nowhere/config\.json'; give a "
                                         r"preset name or the path of a Hugging Face config\.json$"):
        load_config(tmp_path / "nowhere" / "config.json")


def test_config_json_missing_a_field(tmp_path: Path) -> None:
    doc = {k: v for k, v in LLAMA_8B.items() if k != "num_hidden_layers"}
    path = write_config(tmp_path, "broken", doc)
    with pytest.raises(UsageError, match=r"^.*broken/config\.json has no num_hidden_layers; this "
                                         r"planner reads Llama-, Mistral-, Qwen2- and BERT-style "
                                         r"configs, or give the architecture with flags$"):
        load_config(path)
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"^.*broken/config\.json is not a readable JSON config "):
        load_config(path)


def test_flags_must_describe_the_whole_model() -> None:
    with pytest.raises(UsageError, match=r"^describe the model with --model, or give all of "
                                         r"--layers, --hidden, --kv-heads, --head-dim, --vocab, "
                                         r"--params; missing: --vocab, --params$"):
        from_flags(layers=32, hidden=4096, kv_heads=8, head_dim=128, vocab=None, params=None)


# --- the CLI, as a real process -----------------------------------------------------------------


def segue(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEGUE_HOME": str(tmp_path / "home")}
    return subprocess.run([sys.executable, "-m", "segue", "plan", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_cli_prints_json(tmp_path: Path) -> None:
    proc = segue(tmp_path, "--model", "llama-3.1-8b", "--dtype", "bf16", "--gpu", "l4",
                 "--context", "8192", "--batch", "8", "--json", "--allow-no-fit")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["method"] == "formula" and doc["kv_bytes_per_token"] == 131072
    assert doc["fits"] is False and doc["max_batch"] == 4
    assert doc["capacity_bytes"] == 23034 * 2**20 and doc["total_bytes"] > doc["capacity_bytes"]
    assert doc["throughput"]["cost_per_million_tokens"] > 0  # at the catalog's L4 price
    assert not (tmp_path / "home").exists()  # planning writes nothing


def test_cli_reads_a_config_and_a_profile(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "llama", LLAMA_8B)
    proc = segue(tmp_path, "--model", str(cfg), "--gpu", "rtx-pro-6000", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["model"]["params"] == 8_030_261_248
    prof = tmp_path / "minilm.json"
    prof.write_text(json.dumps(profile([(8, 136_000_000), (64, 248_000_000)])))
    proc = segue(tmp_path, "--profile", str(prof), "--batch", "32")
    assert proc.returncode == 0, proc.stderr
    assert "method: profile" in proc.stdout and "largest batch: " in proc.stdout


def test_cli_gpu_mem_in_gb_is_10_to_the_9_in_and_out(tmp_path: Path) -> None:
    proc = segue(tmp_path, "-m", "llama-3.1-8b", "--gpu-mem", "80GB")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^  capacity +80\.00 GB  \(74\.51 GiB\)$", proc.stdout, re.M), proc.stdout
    proc = segue(tmp_path, "-m", "llama-3.1-8b", "--gpu", "h100", "--gpu-mem", "80GiB", "--json")
    doc = json.loads(proc.stdout)
    assert doc["capacity_bytes"] == 80 * 2**30 and doc["gpu"] == "h100"


def cpu_profile(threads: int) -> dict[str, Any]:
    """What bench-model saves on a CPU of ``threads`` cores (tests/inference/test_bench_model.py)."""
    return {**profile([(1, 301_000_000), (16, 316_000_000)]), "device": "cpu", "device_type": "cpu",
            "device_name": "Some CPU", "capacity_bytes": 8_000_000_000, "threads": threads,
            "recommended_batch_size": 16}


def test_cli_prices_a_cpu_profile_at_the_cores_it_was_measured_on(tmp_path: Path) -> None:
    prof = tmp_path / "cpu.json"
    prof.write_text(json.dumps(cpu_profile(threads=2)))
    proc = segue(tmp_path, "--profile", str(prof), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    core_hour = next(e.usd for e in PRICE_CATALOG if e.key == "cpu")
    assert (doc["gpu"], doc["cores"]) == ("cpu", 2)
    assert doc["price_per_hour"] == pytest.approx(2 * core_hour)  # not one core's price
    assert doc["cost_per_1k_items"] == pytest.approx(2 * core_hour / 3600 / 1600 * 1000)
    proc = segue(tmp_path, "--profile", str(prof))
    assert proc.returncode == 0 and " on 2 CPU cores; method: profile" in proc.stdout


@pytest.mark.parametrize("gpu", [["--gpu", "l4"], ["--gpu-mem", "24GB"]])
def test_cli_refuses_to_price_a_cpu_profile_as_a_gpu(tmp_path: Path, gpu: list[str]) -> None:
    prof = tmp_path / "cpu.json"
    prof.write_text(json.dumps(cpu_profile(threads=2)))
    proc = segue(tmp_path, "--profile", str(prof), *gpu, "--json")
    assert proc.returncode == 2 and proc.stdout == "" and proc.stderr.count("\n") == 1
    flag = " ".join(gpu)
    assert re.match(rf"^segue: profile \S+cpu\.json was measured on the CPU: its items/s and peaks "
                    rf"\(process RSS\) cannot be priced as {flag}; measure on that GPU with "
                    rf"`segue bench-model --device cuda`, or drop {gpu[0]} to price it on the 2 CPU "
                    rf"cores it ran on$", proc.stderr), proc.stderr


def test_cli_says_first_that_a_model_does_not_fit_and_exits_1(tmp_path: Path) -> None:
    args = ("-m", "llama-3.1-8b", "--gpu", "l4", "--batch", "8")
    proc = segue(tmp_path, *args)
    assert proc.returncode == 1, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert re.match(r"^does not fit: llama-3\.1-8b needs 28\.30 GB per device at batch 8 x context "
                    r"8192 on 1 x NVIDIA L4 \(24 GB GDDR6\), which has 24\.15 GB \(4\.15 GB over\); "
                    r"largest batch at this context: 4, longest context at this batch: \d+$", first)
    assert "tokens/s" not in proc.stdout and "cost" not in proc.stdout.replace("no roofline or cost", "")
    proc = segue(tmp_path, *args, "--json")
    assert proc.returncode == 1 and json.loads(proc.stdout)["throughput"] is None
    assert proc.stderr.startswith("segue: does not fit: llama-3.1-8b needs ")
    proc = segue(tmp_path, *args, "--allow-no-fit")
    assert proc.returncode == 0 and proc.stdout.startswith("does not fit: ")
    assert "decode roofline (memory-bound) (if it fit; it does not): " in proc.stdout
    prof = tmp_path / "cpu.json"
    prof.write_text(json.dumps(cpu_profile(threads=2)))
    proc = segue(tmp_path, "--profile", str(prof), "--batch", "100000")
    assert proc.returncode == 1 and proc.stdout.startswith(f"does not fit: profile {prof} predicts ")
    assert segue(tmp_path, "--profile", str(prof), "--batch", "6900").returncode == 0  # the edge


@pytest.mark.parametrize(("args", "pattern"), [
    (["--model", "gpt-5", "--gpu", "l4"], r"^segue: unknown model 'gpt-5'; use a preset \("),
    (["--model", "llama-3.1-8b", "--gpu", "l4", "--batch", "-2"],
     r"^segue: batch must be an integer >= 1, not -2$"),
    (["--model", "llama-3.1-8b", "--gpu", "tpu"], r"^segue: unknown GPU 'tpu'; use one of "),
    (["--model", "missing/config.json", "--gpu", "l4"], r"^segue: no config\.json at "),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, args: list[str], pattern: str) -> None:
    proc = segue(tmp_path, *args)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr.count("\n") == 1
    assert re.match(pattern, proc.stderr.strip()), proc.stderr


def test_the_cli_imports_nothing_heavy() -> None:
    code = ("import sys, segue.cli.main, segue.inference.plan; "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'ray', 'pyarrow', 'fastapi')"
            " if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
