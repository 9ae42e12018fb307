"""The GPU memory planner: does a model fit, the largest batch, the longest context, a roofline.

Pure arithmetic over frozen dataclasses, no I/O (``segue plan`` reads files, this
module never does). Every figure is per device; with tensor parallelism (``tp``)
weights, KV heads and activations are split ``tp`` ways. The formulas, with
their sources, are in the docstrings below and in docs/planner.md:

    weights        = quantized_params * bytes(dtype) + embedding_params * bytes(activation)
    quant metadata = ceil(quantized_params / group_size) * (2-byte scale + 2-byte zero)
    KV per token   = 2 (K and V) * layers * kv_heads * head_dim * bytes(kv_dtype)
    KV cache       = KV per token * batch * context
    activations    = tokens * bytes(activation) * (2*hidden + (heads + 2*kv_heads)*head_dim
                     + 2*intermediate*experts_per_token)  [+ logits or attention scores]
    total          = weights + metadata + KV cache + activations + CUDA context + slack*capacity

A measured profile (``segue bench-model``) replaces the formula with a line
fitted to measurements: :func:`fit_profile`, :func:`plan_from_profile`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import UsageError
from .fit import LIMIT, Fit, ProfilePlan, _positive, fit_profile, plan_from_profile, plan_profile
from .gpus import Gpu
from .models import Model

__all__ = ["Assumptions", "Fit", "Memory", "Model", "Plan", "ProfilePlan", "Quant", "Throughput",
           "fit_profile", "kv_bytes_per_token", "plan", "plan_from_profile", "plan_profile",
           "predict_peak_bytes"]

MIB = 1 << 20
DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
                                 "int4": 0.5}
KV_DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8")
SCALE_BYTES = 2  # one fp16 scale per group (GPTQ, AWQ)
ZERO_BYTES = 2  # and one fp16 (or packed) zero point per group; a symmetric scheme has none
LOGITS_BYTES = 4  # the sampler works on fp32 logits, one row of vocab per sequence


@dataclass(frozen=True)
class Quant:
    """Weight dtype, optional group quantization, and the KV-cache dtype.

    ``int4``/``int8`` with a ``group_size`` carry a fp16 scale and a fp16 zero
    point per group of ``group_size`` weights (4 bytes per group: int4 at group
    128 costs 4.25 bits per weight). Without a group size the per-channel
    scales are ignored (a few MB). ``kv_dtype`` defaults to the weight dtype for
    fp32/bf16/fp16 weights and to bf16 for quantized ones, as vLLM does.
    Activations are bf16 (fp32 for fp32 weights); embeddings and the LM head
    stay at the activation dtype (GPTQ, AWQ and FP8 checkpoints keep them so).
    """

    dtype: str = "bf16"
    group_size: int | None = None
    kv_dtype: str | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise UsageError(f"unknown dtype {self.dtype!r}; use one of {', '.join(DTYPE_BYTES)}")
        if self.group_size is not None:
            if self.dtype not in ("int4", "int8"):
                raise UsageError(f"--group-size applies to int4 and int8 weights, not {self.dtype}")
            if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) \
                    or self.group_size < 1:
                raise UsageError(f"group size must be an integer >= 1, not {self.group_size!r}")
        kv = self.kv_dtype or (self.dtype if self.dtype in ("fp32", "bf16", "fp16") else "bf16")
        if kv not in KV_DTYPES:
            raise UsageError(f"unknown KV-cache dtype {kv!r}; use one of {', '.join(KV_DTYPES)}")
        object.__setattr__(self, "kv_dtype", kv)

    @property
    def quantized(self) -> bool:
        return self.dtype in ("fp8", "int8", "int4")

    @property
    def weight_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def act_bytes(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    @property
    def kv_bytes(self) -> float:
        return DTYPE_BYTES[str(self.kv_dtype)]

    @property
    def group_bytes(self) -> int:
        return SCALE_BYTES + ZERO_BYTES if self.group_size else 0


@dataclass(frozen=True)
class Assumptions:
    """What the formula cannot know, with defaults documented in docs/planner.md.

    ``cuda_context_bytes``: the CUDA context, cuBLAS workspace and kernels a
    process holds before its first tensor (300-600 MiB on current drivers;
    500 MiB by default). ``slack``: the fraction of capacity held back for
    allocator fragmentation and whatever the formula misses (vLLM's default
    ``gpu_memory_utilization=0.9`` holds back the same 10%). ``prefill_chunk``:
    the most tokens one forward pass of a decoder takes (chunked prefill, as
    vLLM's ``max_num_batched_tokens``); None sizes activations for the whole
    ``batch * context`` in one pass, as a plain ``model(batch)`` call does.
    """

    cuda_context_bytes: int = 500 * MIB
    slack: float = 0.10
    prefill_chunk: int | None = 8192

    def __post_init__(self) -> None:
        if not 0.0 <= self.slack < 1.0:
            raise UsageError(f"slack must be a fraction from 0 to 1, not {self.slack!r}")
        if self.cuda_context_bytes < 0:
            raise UsageError(f"cuda context must be >= 0 bytes, not {self.cuda_context_bytes}")
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise UsageError(f"prefill chunk must be >= 1 token, not {self.prefill_chunk}")


@dataclass(frozen=True)
class Memory:
    """Bytes per device, by what holds them."""

    weights: int
    quant_metadata: int
    kv_cache: int
    activations: int
    cuda_context: int
    slack: int

    @property
    def total(self) -> int:
        return (self.weights + self.quant_metadata + self.kv_cache + self.activations
                + self.cuda_context + self.slack)


@dataclass(frozen=True)
class Throughput:
    """A roofline: the most a GPU can do, never a measurement.

    ``decode``: one step reads the weights (for MoE only the experts the batch
    touches) and the whole KV cache of the batch, and does ``2 * active_params
    + 4 * layers * context * heads * head_dim`` FLOPs per sequence; a step takes
    the longer of bytes / bandwidth and FLOPs / peak FLOPS, and yields one token
    per sequence. ``encode``: an item of ``context`` tokens costs ``2 *
    (params - embedding_params) * context + 4 * layers * context^2 * heads *
    head_dim`` FLOPs at peak dense bf16 FLOPS.
    """

    kind: str  # "decode" or "encode"
    bound: str  # "memory" or "compute"
    step_s: float  # one decode step, or one item
    bytes_per_step: int  # per device
    per_s: float  # tokens/s of the whole batch (decode) or items/s (encode)
    per_sequence_per_s: float  # decode: tokens/s of one sequence; encode: = per_s
    cost: float | None  # USD per million tokens (decode) or per thousand items (encode)

    def to_json(self) -> dict[str, Any]:
        if self.kind == "decode":
            return {"kind": "decode", "bound": self.bound, "bytes_per_step": self.bytes_per_step,
                    "step_s": self.step_s, "tokens_per_s_per_sequence": self.per_sequence_per_s,
                    "tokens_per_s": self.per_s, "cost_per_million_tokens": self.cost}
        return {"kind": "encode", "bound": self.bound, "items_per_s": self.per_s,
                "cost_per_1k_items": self.cost}


@dataclass(frozen=True)
class Plan:
    """The planner's answer for one model, quantization, GPU, batch and context (per device)."""

    model: Model
    quant: Quant
    gpu: Gpu
    tp: int
    batch: int
    context: int
    kv_bytes_per_token: int  # the whole model's, as published (131072 for Llama-3.1-8B bf16)
    kv_bytes_per_token_per_device: int
    memory: Memory
    fits: bool
    max_batch: int  # at ``context``; 0 when not even one sequence fits
    max_context: int  # at ``batch``; 0 when not even one token fits
    max_context_limit: str  # "memory", or "model" when the model's positions end first
    throughput: Throughput | None
    price_per_hour: float | None
    assumptions: Assumptions
    notes: tuple[str, ...] = ()
    method: str = field(default="formula")

    @property
    def total_bytes(self) -> int:
        return self.memory.total

    @property
    def capacity_bytes(self) -> int:
        return self.gpu.capacity_bytes

    def to_json(self) -> dict[str, Any]:
        m = self.model
        return {
            "method": self.method,
            "model": {"name": m.name, "source": m.source, "layers": m.layers, "hidden": m.hidden,
                      "heads": m.heads, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
                      "vocab": m.vocab, "intermediate": m.intermediate, "params": m.params,
                      "experts": m.experts, "experts_per_token": m.experts_per_token,
                      "encoder": m.encoder, "max_position": m.max_position},
            "dtype": self.quant.dtype, "group_size": self.quant.group_size,
            "kv_dtype": self.quant.kv_dtype, "gpu": self.gpu.key, "tp": self.tp,
            "batch": self.batch, "context": self.context,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_token_per_device": self.kv_bytes_per_token_per_device,
            "breakdown": {"weights": self.memory.weights,
                          "quant_metadata": self.memory.quant_metadata,
                          "kv_cache": self.memory.kv_cache, "activations": self.memory.activations,
                          "cuda_context": self.memory.cuda_context, "slack": self.memory.slack},
            "total_bytes": self.total_bytes, "capacity_bytes": self.capacity_bytes,
            "fits": self.fits, "max_batch": self.max_batch, "max_context": self.max_context,
            "max_context_limit": self.max_context_limit,
            "throughput": None if self.throughput is None else self.throughput.to_json(),
            "price_per_hour": self.price_per_hour,
            "assumptions": {"cuda_context_bytes": self.assumptions.cuda_context_bytes,
                            "slack": self.assumptions.slack,
                            "prefill_chunk": self.assumptions.prefill_chunk},
            "notes": list(self.notes),
        }


def kv_bytes_per_token(model: Model, quant: Quant | str = "bf16") -> int:
    """``2 * layers * kv_heads * head_dim * bytes(kv_dtype)``; 0 for an encoder.

    K and V per layer hold ``kv_heads * head_dim`` numbers each, never
    ``hidden``: with grouped-query attention (Llama 3.1: 8 KV heads of 128 beside
    32 query heads) the cache is ``heads / kv_heads`` times smaller.
    """
    q = _quant(quant)
    if model.encoder:
        return 0
    return math.ceil(2 * model.layers * model.kv_heads * model.head_dim * q.kv_bytes)


def _quant(quant: Quant | str) -> Quant:
    return quant if isinstance(quant, Quant) else Quant(quant)


def _kv_heads_per_device(model: Model, tp: int) -> int:
    """KV heads one device holds: split ``tp`` ways, or replicated when ``tp > kv_heads`` (vLLM)."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise UsageError(f"tp must be an integer >= 1, not {tp!r}")
    if model.heads % tp:
        raise UsageError(f"--tp {tp} does not divide the {model.heads} attention heads of "
                         f"{model.name}; use a divisor of {model.heads}")
    if model.kv_heads >= tp:
        if model.kv_heads % tp:
            raise UsageError(f"--tp {tp} does not divide the {model.kv_heads} KV heads of "
                             f"{model.name}; use a divisor of {model.kv_heads}")
        return model.kv_heads // tp
    if tp % model.kv_heads:
        raise UsageError(f"--tp {tp} is not a multiple of the {model.kv_heads} KV heads of "
                         f"{model.name}; use a divisor or a multiple of {model.kv_heads}")
    return 1


def _kv_per_device(model: Model, q: Quant, tp: int) -> int:
    """KV bytes per token on one device (checks ``tp`` against the heads, encoder or not)."""
    heads = _kv_heads_per_device(model, tp)
    return 0 if model.encoder else math.ceil(2 * model.layers * heads * model.head_dim * q.kv_bytes)


def _weights(model: Model, q: Quant, tp: int) -> tuple[int, int]:
    """(weights, quantization metadata) bytes per device."""
    emb = model.embedding_params if q.quantized else 0
    quantized = model.params - emb
    weights = quantized * q.weight_bytes + emb * q.act_bytes
    groups = math.ceil(quantized / q.group_size) if q.group_size else 0
    return math.ceil(weights / tp), math.ceil(groups * q.group_bytes / tp)


def _activations(model: Model, q: Quant, tp: int, batch: int, context: int,
                 chunk: int | None) -> int:
    """Activation and workspace bytes per device at the peak of one forward pass.

    Per token in flight: the residual stream and its normed copy (``2*hidden``),
    the q/k/v projections (``(heads + 2*kv_heads) * head_dim / tp``) and the
    gated MLP's two up-projections (``2 * intermediate * experts_per_token / tp``),
    at the activation dtype. A decoder has ``min(batch*context, prefill_chunk)``
    tokens in flight plus fp32 logits for one position per sequence (``batch *
    vocab / tp * 4``); an encoder has all ``batch*context`` tokens plus the
    attention scores of eager attention (``batch * heads/tp * context^2``), an
    upper bound that fused kernels (SDPA, flash) stay under.
    """
    tokens = batch * context
    if chunk is not None and not model.encoder:
        tokens = min(tokens, chunk)
    per_token = (2 * model.hidden + (model.heads + 2 * model.kv_heads) * model.head_dim / tp
                 + 2 * model.intermediate * model.experts_per_token / tp)
    total = tokens * per_token * q.act_bytes
    if model.encoder:
        total += batch * model.heads / tp * context * context * q.act_bytes
    else:
        total += batch * model.vocab / tp * LOGITS_BYTES
    return math.ceil(total)


def _memory(model: Model, q: Quant, gpu: Gpu, tp: int, kv_dev: int, batch: int, context: int,
            a: Assumptions) -> Memory:
    weights, meta = _weights(model, q, tp)
    return Memory(weights=weights, quant_metadata=meta, kv_cache=kv_dev * batch * context,
                  activations=_activations(model, q, tp, batch, context, a.prefill_chunk),
                  cuda_context=a.cuda_context_bytes, slack=math.ceil(a.slack * gpu.capacity_bytes))


def _largest(fits: Callable[[int], bool], cap: int = LIMIT) -> int:
    """The largest n in [0, cap] with fits(n), for a monotone ``fits`` (0 if not even 1 fits)."""
    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= cap and fits(hi):  # double until it no longer fits
        lo, hi = hi, hi * 2
    if hi > cap:
        return cap if fits(cap) else _bisect(fits, lo, cap)
    return _bisect(fits, lo, hi)


def _bisect(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """fits(lo) holds and fits(hi) does not: the last n that fits."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _throughput(model: Model, q: Quant, gpu: Gpu, tp: int, kv_dev: int, batch: int, context: int,
                weights: int, meta: int, price: float | None) -> Throughput | None:
    if model.encoder:
        if gpu.flops is None:
            return None
        item_flops = (2 * (model.params - model.embedding_params) * context
                      + 4 * model.layers * context * context * model.heads * model.head_dim)
        item_s = item_flops / (gpu.flops * tp)
        cost = None if price is None else price * tp / 3600 * item_s * 1000
        return Throughput("encode", "compute", item_s, 0, 1 / item_s, 1 / item_s, cost)
    if gpu.bandwidth is None:
        return None
    expert_bytes = model.expert_params * q.weight_bytes / tp
    if model.experts > 1:  # expected share of experts the batch's tokens touch in a layer
        touched = 1 - (1 - model.experts_per_token / model.experts) ** batch
        read: float = weights - expert_bytes * (1 - touched)
    else:
        read = weights
    step_bytes = math.ceil(read + meta + kv_dev * batch * context)
    memory_s = step_bytes / gpu.bandwidth
    flops = batch * (2 * model.active_params
                     + 4 * model.layers * context * model.heads * model.head_dim) / tp
    compute_s = flops / gpu.flops if gpu.flops else 0.0
    step_s = max(memory_s, compute_s)
    per_s = batch / step_s
    cost = None if price is None else price * tp / 3600 / per_s * 1e6
    return Throughput("decode", "memory" if memory_s >= compute_s else "compute", step_s,
                      step_bytes, per_s, 1 / step_s, cost)


def plan(model: Model, quant: Quant | str, gpu: Gpu, *, context: int, batch: int = 1, tp: int = 1,
         price_per_hour: float | None = None, assumptions: Assumptions | None = None) -> Plan:
    """Plan ``batch`` sequences of ``context`` tokens of ``model`` on ``tp`` GPUs of type ``gpu``.

    ``price_per_hour`` is per GPU (``tp`` of them are paid); without it no cost is
    given. Raises :class:`UsageError` for a batch, context or tp that makes no sense.
    """
    q, a = _quant(quant), assumptions or Assumptions()
    batch, context = _positive("batch", batch), _positive("context", context)
    kv_dev = _kv_per_device(model, q, tp)

    def total(b: int, c: int) -> int:
        return _memory(model, q, gpu, tp, kv_dev, b, c, a).total

    mem = _memory(model, q, gpu, tp, kv_dev, batch, context, a)
    cap = gpu.capacity_bytes
    positions = model.max_position or LIMIT
    max_context = _largest(lambda c: total(batch, c) <= cap, positions)
    limit = "model" if max_context == positions and model.max_position else "memory"
    notes = []
    if model.max_position and context > model.max_position:
        notes.append(f"context {context} is longer than the {model.max_position} positions of "
                     f"{model.name}")
    return Plan(model=model, quant=q, gpu=gpu, tp=tp, batch=batch, context=context,
                kv_bytes_per_token=kv_bytes_per_token(model, q), kv_bytes_per_token_per_device=kv_dev,
                memory=mem, fits=mem.total <= cap,
                max_batch=_largest(lambda b: total(b, context) <= cap),
                max_context=max_context, max_context_limit=limit,
                throughput=_throughput(model, q, gpu, tp, kv_dev, batch, context, mem.weights,
                                       mem.quant_metadata, price_per_hour),
                price_per_hour=price_per_hour, assumptions=a, notes=tuple(notes))


def predict_peak_bytes(model: Model, *, batch: int, seq_len: int, quant: Quant | str = "bf16",
                       tp: int = 1) -> int:
    """What ``torch.cuda.max_memory_allocated`` should show after one forward pass of ``batch``
    sequences of ``seq_len`` tokens: weights + quantization metadata + KV cache +
    activations for the whole batch in one pass (no prefill chunking), per device.

    The CUDA context and allocator slack are left out: PyTorch's allocator counts
    neither. For an encoder such as all-MiniLM-L6-v2 that is weights plus
    ``batch*seq_len * bytes * (2*hidden + 3*hidden + 2*intermediate) + batch *
    heads * seq_len^2 * bytes`` (see ``_activations``).
    """
    q = _quant(quant)
    batch, seq_len = _positive("batch", batch), _positive("seq_len", seq_len)
    kv_dev = _kv_per_device(model, q, tp)
    weights, meta = _weights(model, q, tp)
    return (weights + meta + kv_dev * batch * seq_len
            + _activations(model, q, tp, batch, seq_len, None))
