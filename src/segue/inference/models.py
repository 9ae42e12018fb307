"""Model architectures for the memory planner: built-in presets and Hugging Face ``config.json``.

A :class:`Model` holds the handful of numbers the planner needs (layers, widths,
heads, vocabulary, experts, parameter count). Presets carry the published
parameter counts; a ``config.json`` gets its count estimated by
:func:`estimate_params`, which reproduces the presets' published figures
exactly (a test pins that). This module reads a config file and nothing else;
the arithmetic lives in :mod:`segue.inference.plan`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import UsageError

# Hugging Face ``model_type`` values of bidirectional encoders: they keep no KV cache.
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "mpnet", "electra",
                           "deberta", "deberta-v2", "nomic_bert", "modernbert"})
# Decoders whose q/k/v projections carry a bias even though config.json does not say so.
_QKV_BIAS_TYPES = frozenset({"qwen2", "qwen2_moe"})


@dataclass(frozen=True)
class Model:
    """The architecture numbers the planner uses.

    ``kv_heads`` < ``heads`` is grouped-query attention: the KV cache holds
    ``kv_heads`` heads of ``head_dim`` per layer, not ``hidden``.
    ``embedding_params`` (token embeddings, plus the LM head when untied, plus
    BERT's position and type embeddings) are never quantized. ``expert_params``
    is the part of ``params`` inside MoE experts, of which a token uses
    ``experts_per_token`` of ``experts``.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int
    params: int
    embedding_params: int
    experts: int = 1
    experts_per_token: int = 1
    expert_params: int = 0
    encoder: bool = False
    max_position: int | None = None
    source: str = "preset"  # "preset", "config.json" or "flags"

    @property
    def active_params(self) -> float:
        """Parameters one token passes through (all of them unless MoE)."""
        return self.params - self.expert_params * (1 - self.experts_per_token / self.experts)


def estimate_params(*, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                    vocab: int, intermediate: int, experts: int = 1, encoder: bool = False,
                    tied: bool = False, qkv_bias: bool = False, o_bias: bool = False,
                    mlp_bias: bool = False, max_position: int = 512,
                    type_vocab: int = 2) -> tuple[int, int, int]:
    """(params, embedding_params, expert_params) of a Llama-family decoder or a BERT encoder.

    Decoder (Llama, Mistral, Mixtral, Qwen2): per layer q and o are
    ``hidden x heads*head_dim``, k and v ``hidden x kv_heads*head_dim`` (``qkv_bias``:
    biases on q, k and v, as Qwen2; ``o_bias``: on o too, as Llama's
    ``attention_bias``), a gated MLP of 3 ``hidden x intermediate`` matrices per
    expert (``mlp_bias``: with their biases, Llama's ``mlp_bias``), a router
    ``hidden x experts`` when ``experts > 1``, two RMSNorms; then a final
    norm, the embeddings and an LM head unless tied. Llama-3.1-8B gives
    8,030,261,248 and Mixtral-8x7B 46,702,792,704, the published counts.

    Encoder (BERT): word, position and type embeddings with a LayerNorm; per layer
    q, k, v, o with biases, a 2-matrix MLP with biases, two LayerNorms; a pooler.
    all-MiniLM-L6-v2 gives 22,713,216.
    """
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    if encoder:
        emb = (vocab + max_position + type_vocab) * hidden + 2 * hidden
        layer = (hidden * q_out + q_out + 2 * (hidden * kv_out + kv_out) + q_out * hidden + hidden
                 + 2 * hidden + 2 * hidden * intermediate + intermediate + hidden + 2 * hidden)
        return emb + layers * layer + hidden * hidden + hidden, emb, 0
    attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
    if qkv_bias:
        attn += q_out + 2 * kv_out
    if o_bias:
        attn += hidden
    expert = 3 * hidden * intermediate + (2 * intermediate + hidden if mlp_bias else 0)
    router = hidden * experts if experts > 1 else 0
    layer = attn + experts * expert + router + 2 * hidden
    emb = vocab * hidden * (1 if tied else 2)
    expert_params = layers * experts * expert if experts > 1 else 0
    return emb + layers * layer + hidden, emb, expert_params


def _preset(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
            vocab: int, intermediate: int, params: int, max_position: int, experts: int = 1,
            experts_per_token: int = 1, encoder: bool = False) -> Model:
    _, emb, expert = estimate_params(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                     head_dim=head_dim, vocab=vocab, intermediate=intermediate,
                                     experts=experts, encoder=encoder, max_position=max_position)
    return Model(name, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate, params, emb,
                 experts, experts_per_token, expert, encoder, max_position, "preset")


# Numbers from each model's config.json on the Hugging Face hub; parameter counts
# are the published ones (and what estimate_params computes from the configs).
PRESETS: dict[str, Model] = {m.name: m for m in (
    # meta-llama/Llama-3.1-8B: 32 layers, 8 KV heads of 128 -> 128 KiB of bf16 KV per token.
    _preset("llama-3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
            vocab=128256, intermediate=14336, params=8_030_261_248, max_position=131072),
    # meta-llama/Llama-3.1-70B: 80 layers, 8 KV heads of 128 -> 320 KiB of bf16 KV per token.
    _preset("llama-3.1-70b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
            vocab=128256, intermediate=28672, params=70_553_706_496, max_position=131072),
    # Qwen/Qwen2.5-72B: 80 layers, 8 KV heads of 128, q/k/v biases, 32768 positions (no YaRN).
    _preset("qwen2.5-72b", layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
            vocab=152064, intermediate=29568, params=72_706_203_648, max_position=32768),
    # mistralai/Mixtral-8x7B-v0.1: 32 layers, 8 experts of which 2 per token (~12.9B active).
    _preset("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
            vocab=32000, intermediate=14336, params=46_702_792_704, max_position=32768,
            experts=8, experts_per_token=2),
    # sentence-transformers/all-MiniLM-L6-v2: a 6-layer BERT encoder, 384 wide, 12 heads of 32.
    _preset("all-minilm-l6-v2", layers=6, hidden=384, heads=12, kv_heads=12, head_dim=32,
            vocab=30522, intermediate=1536, params=22_713_216, max_position=512, encoder=True),
)}


def preset(name: str) -> Model:
    """A preset by name, case-insensitive; a hub id such as ``meta-llama/Llama-3.1-8B`` works too."""
    key = name.strip().lower().rsplit("/", 1)[-1]
    key = key.removesuffix("-instruct")
    if key not in PRESETS:
        raise UsageError(f"unknown model {name!r}; use a preset ({', '.join(PRESETS)}), "
                         f"a path to a Hugging Face config.json, or the --layers/--hidden/... flags")
    return PRESETS[key]


@dataclass(frozen=True)
class _Config:
    doc: Mapping[str, Any]
    where: str

    def int(self, *keys: str, default: int | None = None) -> int:
        for k in keys:
            v = self.doc.get(k)
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise UsageError(f"{self.where}: {k} must be a non-negative integer, not {v!r}")
                return v
        if default is None:
            raise UsageError(f"{self.where} has no {keys[0]}; this planner reads Llama-, Mistral-, "
                             f"Qwen2- and BERT-style configs, or give the architecture with flags")
        return default


def load_config(path: str | Path) -> Model:
    """A :class:`Model` from a Hugging Face ``config.json`` (or a directory holding one).

    Reads ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``vocab_size`` and ``intermediate_size`` (required), ``num_key_value_heads``
    (default: the attention heads), ``head_dim`` (default ``hidden_size //
    num_attention_heads``), ``num_local_experts`` and ``num_experts_per_tok``
    (MoE), ``max_position_embeddings`` and ``tie_word_embeddings`` (default
    false, as Llama, Mistral and Qwen2 declare), ``attention_bias`` (Llama: biases on
    q, k, v and o; Qwen2 always has them on q, k and v) and ``mlp_bias``. A ``model_type`` in
    :data:`ENCODER_TYPES` makes it an encoder: no KV cache. A multimodal config
    whose text model sits under ``text_config`` is read from there.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"no config.json at {str(p)!r}; give a preset name or the path of a "
                         f"Hugging Face config.json") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{p} is not a readable JSON config ({exc}); download the model's "
                         f"config.json again") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{p} is not a JSON object; give a Hugging Face config.json")
    if "num_hidden_layers" not in doc and isinstance(doc.get("text_config"), dict):
        doc = {"model_type": doc.get("model_type"), **doc["text_config"]}
    return model_from_config(doc, where=str(p), name=p.parent.name or p.stem)


def model_from_config(doc: Mapping[str, Any], *, where: str = "config.json",
                      name: str = "config") -> Model:
    """A :class:`Model` from an already-parsed ``config.json`` (see :func:`load_config`)."""
    c = _Config(doc, where)
    layers = c.int("num_hidden_layers")
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    vocab = c.int("vocab_size")
    intermediate = c.int("intermediate_size")
    if layers < 1 or hidden < 1 or heads < 1:
        raise UsageError(f"{where}: num_hidden_layers, hidden_size and num_attention_heads must be >= 1")
    kv_heads = c.int("num_key_value_heads", default=heads)
    head_dim = c.int("head_dim", default=hidden // heads)
    experts = max(1, c.int("num_local_experts", default=1))
    per_token = min(experts, max(1, c.int("num_experts_per_tok", default=1)))
    model_type = str(doc.get("model_type") or "").lower()
    encoder = model_type in ENCODER_TYPES
    # Qwen2 hard-wires biases on q, k and v (not o) and has no attention_bias; Llama's
    # attention_bias puts one on q, k, v and o (transformers' LlamaAttention).
    if model_type in _QKV_BIAS_TYPES:
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(doc.get("attention_bias", False))
    max_position = c.int("max_position_embeddings", default=0) or None
    params, emb, expert = estimate_params(
        layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
        vocab=vocab, intermediate=intermediate, experts=experts, encoder=encoder,
        tied=bool(doc.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=bool(doc.get("mlp_bias", False)),
        max_position=max_position or 512, type_vocab=c.int("type_vocab_size", default=2))
    return Model(name, layers, hidden, heads, kv_heads, head_dim, vocab, intermediate, params, emb,
                 experts, per_token, expert, encoder, max_position, "config.json")


def from_flags(*, layers: int | None, hidden: int | None, kv_heads: int | None,
               head_dim: int | None, vocab: int | None, params: int | None,
               heads: int | None = None, intermediate: int | None = None,
               encoder: bool = False) -> Model:
    """A :class:`Model` from explicit numbers (the ``--layers --hidden ...`` flags).

    ``heads`` defaults to ``hidden // head_dim``, ``intermediate`` to ``4 * hidden``
    (it only sizes activations); embeddings are taken as untied,
    ``2 * vocab * hidden`` parameters (``vocab * hidden`` for an encoder).
    """
    given = {"--layers": layers, "--hidden": hidden, "--kv-heads": kv_heads, "--head-dim": head_dim,
             "--vocab": vocab, "--params": params}
    if encoder:
        given.pop("--kv-heads")
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise UsageError(f"describe the model with --model, or give all of {', '.join(given)}; "
                         f"missing: {', '.join(missing)}")
    for flag, v in (*given.items(), ("--heads", heads), ("--intermediate", intermediate)):
        if v is not None and v < 1:
            raise UsageError(f"{flag} must be >= 1, not {v}")
    n = {k: int(v) for k, v in given.items() if v is not None}  # all present: checked above
    hid, hd, voc = n["--hidden"], n["--head-dim"], n["--vocab"]
    n_heads = heads or max(1, hid // hd)
    emb = voc * hid * (1 if encoder else 2)
    return Model("custom", n["--layers"], hid, n_heads, kv_heads or n_heads, hd, voc,
                 intermediate or 4 * hid, n["--params"], min(emb, n["--params"]), encoder=encoder,
                 source="flags")


def with_params(model: Model, params: int) -> Model:
    """``model`` with its parameter count replaced (``--params`` beside ``--model``)."""
    if params < 1:
        raise UsageError(f"--params must be >= 1, not {params}")
    scale = params / model.params
    return replace(model, params=params, expert_params=math.floor(model.expert_params * scale),
                   embedding_params=min(model.embedding_params, params))
