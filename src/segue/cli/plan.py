"""`segue plan`: will a model fit a GPU, the largest batch, the longest context, a roofline, a cost.

A thin shell over :mod:`segue.inference.plan`: it turns flags and files (a
``config.json``, a measured profile, the home's prices) into the planner's
inputs and prints its answer. Formulas and assumptions: docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from ..errors import EXIT_FAILED, EXIT_OK, UsageError
from ..home import Home
from ..inference import gpus, models
from ..inference.plan import (
    Assumptions,
    Plan,
    ProfilePlan,
    Quant,
    plan,
    plan_profile,
)
from ..placement.pricing import CPU, DEFAULTS, Prices, load_overrides
from ..units import in_unit, parse_bytes
from .render import human_bytes, print_json

ARCH_FLAGS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "intermediate")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help="predict the GPU memory of LLM or encoder inference: fits?, "
                                    "largest batch, longest context, decode roofline, cost")
    src = p.add_argument_group("model (one of)")
    src.add_argument("--model", "-m", metavar="NAME|CONFIG",
                     help=f"a preset ({', '.join(models.PRESETS)}) or a Hugging Face config.json")
    src.add_argument("--profile", metavar="PATH.json",
                     help="a profile measured by `segue bench-model`: fit it instead of the formula")
    for name in ARCH_FLAGS:
        src.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, metavar="N")
    src.add_argument("--params", type=int, default=None, metavar="N",
                     help="parameter count (with --model: replaces the estimate)")
    src.add_argument("--encoder", action="store_true", help="the flags describe an encoder (no KV cache)")
    p.add_argument("--dtype", default="bf16", help="weights: fp32, bf16, fp16, fp8, int8, int4 (default bf16)")
    p.add_argument("--group-size", type=int, default=None, metavar="N",
                   help="int4/int8 group size: a fp16 scale and zero point per N weights")
    p.add_argument("--kv-dtype", default=None, help="KV cache dtype (default: the weights' if 16/32-bit, else bf16)")
    p.add_argument("--context", type=int, default=None, metavar="TOKENS",
                   help="tokens per sequence (default 8192; an encoder's maximum up to 512)")
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="concurrent sequences (default 1; with --profile its recommended batch)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel GPUs (default 1)")
    p.add_argument("--gpu", default=None, help=f"one of {', '.join(gpus.CATALOG)} (or rtx-pro-6000)")
    p.add_argument("--gpu-mem", default=None, metavar="SIZE",
                   help="memory per GPU, e.g. 48GB (10^9 bytes) or 44.7GiB (2^30 bytes)")
    p.add_argument("--price", type=float, default=None, metavar="USD",
                   help="USD per GPU-hour (default: `segue prices`); with a CPU --profile, per hour "
                        "of the cores it was measured on")
    p.add_argument("--cuda-context", default="500MiB", metavar="SIZE",
                   help="memory a process holds before its first tensor (default 500MiB)")
    p.add_argument("--slack", type=float, default=0.10, metavar="FRACTION",
                   help="fraction of capacity held back for the allocator (default 0.10)")
    p.add_argument("--prefill-chunk", type=int, default=8192, metavar="TOKENS",
                   help="most tokens in one forward pass of a decoder; 0: the whole batch (default 8192)")
    p.add_argument("--allow-no-fit", action="store_true",
                   help="a plan that does not fit still gets its roofline and cost, and exits 0 "
                        "(default: exit 1 after saying it does not fit)")
    p.add_argument("--json", action="store_true")


def _model(a: argparse.Namespace) -> models.Model:
    arch = {k: getattr(a, k) for k in ARCH_FLAGS if getattr(a, k) is not None}
    if a.model is None:
        if not arch and a.params is None:
            raise UsageError("give --model NAME|config.json, --profile PATH.json, or the "
                             "--layers/--hidden/--kv-heads/--head-dim/--vocab/--params flags")
        return models.from_flags(layers=a.layers, hidden=a.hidden, kv_heads=a.kv_heads,
                                 head_dim=a.head_dim, vocab=a.vocab, params=a.params, heads=a.heads,
                                 intermediate=a.intermediate, encoder=a.encoder)
    if arch:
        raise UsageError(f"give --model or the architecture flags, not both "
                         f"(--{next(iter(arch)).replace('_', '-')} was given)")
    # A hub id ("meta-llama/Llama-3.1-8B") names a preset unless such a path exists here.
    is_path = a.model.endswith(".json") or Path(a.model).exists()
    m = models.load_config(a.model) if is_path else models.preset(a.model)
    return m if a.params is None else models.with_params(m, a.params)


def _size(value: str, flag: str) -> int:
    return parse_bytes(value, flag, error=UsageError)


def _gpu(a: argparse.Namespace, profile: dict[str, Any] | None = None) -> gpus.Gpu:
    base = gpus.gpu(a.gpu) if a.gpu else None
    if a.gpu_mem is not None:
        return gpus.custom(_size(a.gpu_mem, "--gpu-mem"), base)
    if base is not None:
        return base
    if profile is not None:
        cap = profile.get("capacity_bytes")
        if isinstance(cap, int) and cap > 0:
            key = str(profile.get("device_type") or "gpu")
            known = gpus.CATALOG.get(key)
            return gpus.Gpu(key, str(profile.get("device_name") or key), cap,
                            known.bandwidth if known else None, known.flops if known else None)
    raise UsageError(f"give --gpu ({', '.join(gpus.CATALOG)}) or --gpu-mem SIZE")


def _price(a: argparse.Namespace, home: Home, key: str, cores: int = 1) -> float | None:
    """USD per hour of the device: ``--price``, else the home's prices; the CPU's is per
    core-hour, so a CPU profile is priced at the ``cores`` it was measured on."""
    if a.price is not None:
        if not math.isfinite(a.price) or a.price < 0:
            raise UsageError(f"--price must be a finite number of USD >= 0, not {a.price}")
        return float(a.price)
    own = load_overrides(home.root)
    if key in own or key in DEFAULTS:
        return Prices.resolve(home.root).per_hour(key) * (cores if key == CPU else 1)
    return None  # a GPU of unknown type: no cost rather than a made-up one


def _profile_cores(profile: dict[str, Any], path: str) -> int:
    """The cores a CPU profile's throughput was measured on (bench-model's ``threads``)."""
    n = profile.get("threads", 1)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UsageError(f"profile {path}: threads must be a positive int (the cores it was "
                         f"measured on), not {n!r}; measure again with `segue bench-model`")
    return n


def _check_profile_device(profile: dict[str, Any], a: argparse.Namespace, path: str) -> None:
    """A CPU profile describes the CPU it ran on: its items/s and its peaks (the process's
    RSS) say nothing about a GPU's, so pricing it as one would mix two machines."""
    if profile.get("device_type") == CPU and (a.gpu is not None or a.gpu_mem is not None):
        flag = f"--gpu {a.gpu}" if a.gpu is not None else f"--gpu-mem {a.gpu_mem}"
        raise UsageError(f"profile {path} was measured on the CPU: its items/s and peaks (process "
                         f"RSS) cannot be priced as {flag}; measure on that GPU with `segue "
                         f"bench-model --device cuda`, or drop {flag.split()[0]} to price it on the "
                         f"{_profile_cores(profile, path)} CPU cores it ran on")


def _read_profile(path: str) -> dict[str, Any]:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"no profile at {path!r}; measure one with `segue bench-model`") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"profile {path} is not readable JSON ({exc}); measure again with "
                         f"`segue bench-model`") from None
    if not isinstance(doc, dict):
        raise UsageError(f"profile {path} is not a JSON object; measure again with `segue bench-model`")
    return doc


def cmd_plan(a: argparse.Namespace, home: Home) -> int:
    if a.profile is not None:
        if a.model is not None:
            raise UsageError("give --model or --profile, not both")
        profile = _read_profile(a.profile)
        _check_profile_device(profile, a, a.profile)
        g = _gpu(a, profile)
        cores = _profile_cores(profile, a.profile) if g.key == CPU else 1
        price = _price(a, home, g.key, cores)
        pp = plan_profile(profile, g.capacity_bytes, batch=a.batch, slack=a.slack,
                          price_per_hour=price)
        refused = not pp.fits and not a.allow_no_fit
        if a.json:
            doc = {**pp.to_json(), "profile": a.profile, "gpu": g.key, "cores": cores,
                   "price_per_hour": price}
            if refused:  # no throughput or cost for what cannot run
                doc.update(items_per_s=None, cost_per_1k_items=None)
            print_json(doc)
        else:
            _print_profile(pp, g, a.profile, cores, refused)
        return _no_fit_exit(pp.fits, a, _profile_no_fit(pp, a.profile))
    m = _model(a)
    chunk = None if a.prefill_chunk == 0 else a.prefill_chunk
    assumptions = Assumptions(cuda_context_bytes=_size(a.cuda_context, "--cuda-context"),
                              slack=a.slack, prefill_chunk=chunk)
    quant = Quant(a.dtype.lower(), a.group_size, a.kv_dtype.lower() if a.kv_dtype else None)
    g = _gpu(a)
    context = a.context if a.context is not None else (
        min(m.max_position or 512, 512) if m.encoder else 8192)
    p = plan(m, quant, g, context=context, batch=1 if a.batch is None else a.batch, tp=a.tp,
             price_per_hour=_price(a, home, g.key), assumptions=assumptions)
    refused = not p.fits and not a.allow_no_fit
    if a.json:
        doc = p.to_json()
        if refused:  # no roofline or cost for what cannot run
            doc.update(throughput=None)
        print_json(doc)
    else:
        _print_plan(p, refused)
    return _no_fit_exit(p.fits, a, _plan_no_fit(p))


def _no_fit_exit(fits: bool, a: argparse.Namespace, line: str) -> int:
    """Exit 1 for a plan that does not fit (docs/planner.md), unless ``--allow-no-fit``.
    With --json the one line goes to stderr too: the document on stdout stays parseable."""
    if fits or a.allow_no_fit:
        return EXIT_OK
    if a.json:
        print(f"segue: {line}", file=sys.stderr)
    return EXIT_FAILED


def _plan_no_fit(p: Plan) -> str:
    over = p.total_bytes - p.capacity_bytes
    return (f"does not fit: {p.model.name} needs {in_unit(p.total_bytes, 'GB')} per device at batch "
            f"{p.batch} x context {p.context} on {p.tp} x {p.gpu.label}, which has "
            f"{in_unit(p.capacity_bytes, 'GB')} ({in_unit(over, 'GB')} over); largest batch at this "
            f"context: {p.max_batch}, longest context at this batch: {p.max_context}")


def _profile_no_fit(pp: ProfilePlan, path: str) -> str:
    usable = pp.capacity_bytes * (1 - pp.slack)
    return (f"does not fit: profile {path} predicts a peak of {in_unit(pp.predicted_peak_bytes, 'GB')} "
            f"at batch {pp.batch}, over the {in_unit(usable, 'GB')} usable ({pp.slack:.0%} of "
            f"{in_unit(pp.capacity_bytes, 'GB')} held back); largest batch: {pp.max_batch}")


def _gb(n: float) -> str:
    return f"{in_unit(n, 'GB'):>11}"


def _print_plan(p: Plan, refused: bool = False) -> None:
    m, q, mem = p.model, p.quant, p.memory
    if not p.fits:
        print(_plan_no_fit(p))
    group = f" (group {q.group_size})" if q.group_size else ""
    print(f"{m.name} ({m.source}, {m.params / 1e9:.3g}B params{', encoder' if m.encoder else ''}) "
          f"on {p.tp} x {p.gpu.label}")
    print(f"{q.dtype}{group} weights, {'no' if m.encoder else q.kv_dtype} KV cache, "
          f"batch {p.batch} x context {p.context}; method: formula (docs/planner.md)")
    kv = ("none (encoder)" if m.encoder else
          f"{p.kv_bytes_per_token / 1024:g} KiB/token ({p.kv_bytes_per_token_per_device / 1024:g} "
          f"KiB per device) x {p.batch * p.context} tokens")
    rows = [("weights", mem.weights, ""), ("quantization metadata", mem.quant_metadata, ""),
            ("KV cache", mem.kv_cache, kv), ("activations + workspace", mem.activations, ""),
            ("CUDA context", mem.cuda_context, ""),
            ("allocator slack", mem.slack, f"{p.assumptions.slack:.0%} of capacity")]
    print("per device:")
    for name, n, note in rows:
        print(f"  {name:<24}{_gb(n)}  {note}".rstrip())
    print(f"  {'total':<24}{_gb(p.total_bytes)}")
    print(f"  {'capacity':<24}{_gb(p.capacity_bytes)}  ({in_unit(p.capacity_bytes, 'GiB')})")
    margin = p.capacity_bytes - p.total_bytes
    print(f"fits: {'yes' if p.fits else 'no'} ({human_bytes(abs(margin))} "
          f"{'to spare' if p.fits else 'over'})")
    print(f"largest batch at context {p.context}: {p.max_batch}")
    print(f"longest context at batch {p.batch}: {p.max_context}"
          + (" (the model's positions)" if p.max_context_limit == "model" else ""))
    t = p.throughput
    if refused:
        print("no roofline or cost: it does not fit (give --allow-no-fit to see them anyway)")
        t = None
    elif t is None:
        print("roofline: unknown for this GPU (give --gpu for its bandwidth)")
    elif t.kind == "decode":
        print(f"decode roofline ({t.bound}-bound){_IF_FIT if not p.fits else ''}: "
              f"{t.per_sequence_per_s:.1f} tokens/s per "
              f"sequence, {t.per_s:.1f} tokens/s for the batch ({human_bytes(t.bytes_per_step)} "
              f"read per step)")
    else:
        print(f"encode roofline ({t.bound}-bound){_IF_FIT if not p.fits else ''}: "
              f"{t.per_s:.1f} items/s")
    if t is not None and t.cost is not None:
        unit = "million tokens" if t.kind == "decode" else "thousand items"
        print(f"cost{_IF_FIT if not p.fits else ''}: ${t.cost:.4g} per {unit} at "
              f"${p.price_per_hour:g}/GPU-hour x {p.tp} "
              f"(at the roofline: the real cost is higher)")
    for line in p.notes:
        print(f"note: {line}")


_IF_FIT = " (if it fit; it does not)"


def _print_profile(pp: ProfilePlan, g: gpus.Gpu, path: str, cores: int = 1,
                   refused: bool = False) -> None:
    if not pp.fits:
        print(_profile_no_fit(pp, path))
    on = f"{cores} CPU cores" if g.key == CPU else g.label
    print(f"{path} on {on}; method: profile (a line fitted to measured peaks)")
    print(f"peak = {human_bytes(pp.fit.base_bytes)} + {human_bytes(pp.fit.slope_bytes_per_item)} "
          f"x batch ({pp.fit.points} measured batches)")
    print(f"capacity {human_bytes(pp.capacity_bytes)}, {pp.slack:.0%} held back")
    print(f"largest batch: {pp.max_batch}")
    print(f"at batch {pp.batch}: peak {human_bytes(pp.predicted_peak_bytes)}, "
          f"fits: {'yes' if pp.fits else 'no'}")
    if refused:
        print("no throughput or cost: it does not fit (give --allow-no-fit to see them anyway)")
    elif pp.items_per_s is not None:
        cost = "" if pp.cost_per_1k_items is None else f", ${pp.cost_per_1k_items:.4g} per thousand items"
        print(f"measured at batch {pp.measured_batch}{_IF_FIT if not pp.fits else ''}: "
              f"{pp.items_per_s:.1f} items/s{cost}")
    if pp.extrapolated:
        print(f"note: batches above {pp.largest_measured} are extrapolated from the fit; "
              f"measure them with `segue bench-model` before relying on them")
