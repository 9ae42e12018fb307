"""Measure a model handler on a device: what ``segue bench-model`` writes as a profile.

:func:`measure` loads a handler's model once, then runs ``items`` inputs
through it at each batch size (ascending) and records the load time and
memory, and per batch size the peak memory, first-batch latency, steady
throughput, p50/p95 batch latency and cost per thousand items. The result is a
version-1 profile (:mod:`segue.inference.profiles`, format in
docs/inference.md) with the recommended batch: :func:`recommend`. A generate
handler is measured per batch size by :mod:`segue.inference.bench_generate`
instead (time to first token, prefill and decode tokens/s, cost per million
tokens; recommended by tokens/s).

Peak memory, per device:

- CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
  (what the planner's ``predict_peak_bytes`` predicts), plus the reserved peak
  and NVML's used memory (CUDA context included) when ``pynvml`` imports; a
  batch *fits* on the largest of them.
- CPU: the process's resident-set high-water mark, ``VmHWM`` in
  ``/proc/self/status``, reset to the current RSS before each batch size by
  writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0). ``ru_maxrss``
  never goes down, so it could only measure the first batch size. Batch sizes
  run in ascending order, so what the allocator keeps from a smaller batch is
  reused by the next larger one rather than added to it. Without clear_refs
  (another OS) the peak falls back to ``ru_maxrss``, an upper bound, and the
  profile says so (``peak_method``).

This module measures and returns data; it never prints. Torch and NumPy are
imported only when a measurement starts.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import math
import os
import random
import re
import resource
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..units import UNITS, in_unit
from . import bench_generate
from .capacity import cpu_capacity as cpu_capacity
from .capacity import device_capacity as _capacity
from .handler import ModelHandler
from .profiles import PROFILE_VERSION, device_type_of
from .stability import MAX_SPREAD, again, p95, settle

PLOT_UNIT = "GB"  # the plot's memory axis: 10^9 bytes, as the table's human_bytes counts
SLACK = 0.10  # capacity held back, as the planner does (docs/planner.md)
DEFAULT_BATCH_SIZES = (1, 8, 32, 128)
DEFAULT_ITEMS = 256
MIN_BATCHES = 3  # per batch size: the first (cold) and at least two steady ones
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")

_WORDS = ("the model reads short texts about rivers mountains trains and small towns "
          "where people write letters cook dinner repair bicycles and watch the weather "
          "change slowly over quiet fields while markets open early and close late").split()


# -- inputs ------------------------------------------------------------------------------
def parse_batch_sizes(text: str) -> list[int]:
    """``"1,8,32"`` as sorted distinct ints >= 1, or a one-line UsageError."""
    sizes = []
    for part in text.split(","):
        try:
            n = int(part.strip())
        except ValueError:
            raise UsageError(f"--batch-sizes {text!r} must be comma-separated integers >= 1, "
                             f"e.g. 1,8,32,128") from None
        if n < 1:
            raise UsageError(f"--batch-sizes {text!r}: {n} is below 1; batch sizes are >= 1")
        sizes.append(n)
    return sorted(set(sizes))


def sample_texts(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic short texts of 6 to 40 words (the padding varies as real text's)."""
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(6, 40))) + f" {i}."
            for i in range(n)]


def read_inputs(path: str | os.PathLike[str], field: str | None, n: int) -> list[Any]:
    """Up to ``n`` inputs from a JSONL file: each record's ``field`` (the whole record without
    one), repeated from the start when the file holds fewer."""
    got: list[Any] = []
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    raise UsageError(f"--inputs {path}: line {lineno} is not JSON") from None
                if field is not None:
                    if not isinstance(rec, dict) or field not in rec:
                        raise UsageError(f"--inputs {path}: line {lineno} has no field {field!r}; "
                                         f"give --field NAME")
                    rec = rec[field]
                got.append(rec)
                if len(got) >= n:
                    break
    except FileNotFoundError:
        raise UsageError(f"--inputs {path!s} does not exist; give a JSONL file") from None
    if not got:
        raise UsageError(f"--inputs {path} holds no records")
    return [got[i % len(got)] for i in range(n)]


def sample_inputs(handler: ModelHandler[Any], raw: Any, n: int) -> list[Any]:
    """``n`` deterministic inputs the handler accepts, or a UsageError asking for ``--inputs``.

    A handler may say itself with a ``bench_inputs(n)`` method; text handlers
    (sentence-transformers, transformers) get :func:`sample_texts`; a PyTorch
    module without an ``inference_fn`` gets float32 vectors as wide as its first
    weight matrix's input; an ONNX model gets arrays of its first input's shape.
    """
    own = getattr(handler, "bench_inputs", None)
    if callable(own):
        return list(own(n))
    from .handlers import (
        OnnxModelHandler,
        PytorchModelHandler,
        SentenceTransformerHandler,
        TransformersHandler,
    )

    if isinstance(handler, SentenceTransformerHandler | TransformersHandler):
        return sample_texts(n)
    import numpy as np

    rng = np.random.default_rng(0)
    if isinstance(handler, PytorchModelHandler) and handler.inference_fn is None:
        first = next((p for p in raw.parameters() if p.dim() == 2), None)
        if first is not None:
            return list(rng.standard_normal((n, int(first.shape[1]))).astype(np.float32))
    if isinstance(handler, OnnxModelHandler):
        shape = raw.get_inputs()[0].shape[1:]
        if all(isinstance(d, int) and d > 0 for d in shape):
            return list(rng.standard_normal((n, *shape)).astype(handler.dtype))
    raise UsageError(f"cannot make sample inputs for handler {handler.name!r} "
                     f"({type(handler).__name__}); give --inputs FILE.jsonl --field NAME")


# -- the device: memory, capacity, price ---------------------------------------------------
def _status_kib(key: str) -> int | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) if m else None


class CpuMemory:
    """Process RSS: current, and the high-water mark since :meth:`reset` (see the module doc)."""

    def __init__(self) -> None:
        self.method = "VmHWM after /proc/self/clear_refs=5 (process RSS peak)"
        if not self._clear():
            self.method = "ru_maxrss (process RSS peak since start: an upper bound)"

    @staticmethod
    def _clear() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return _status_kib("VmHWM") is not None
        except OSError:
            return False

    def reset(self) -> None:
        if self.method.startswith("VmHWM"):
            self._clear()

    def current(self) -> int:
        kib = _status_kib("VmRSS")
        return (kib or 0) * 1024

    def peak(self) -> dict[str, int]:
        kib = _status_kib("VmHWM") if self.method.startswith("VmHWM") else None
        if kib is None:  # ru_maxrss is in KiB on Linux, bytes on macOS
            r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return {"peak_bytes": r if sys.platform == "darwin" else r * 1024}
        return {"peak_bytes": kib * 1024}


class CudaMemory:
    """PyTorch's allocated and reserved peaks since :meth:`reset`, and NVML's used memory."""

    method = "torch.cuda.max_memory_allocated after reset_peak_memory_stats"

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        self.nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self._pynvml = pynvml
        except Exception:  # no NVML (or no binding): PyTorch's own figures only
            self.nvml = None
        self.nvml_peak = 0

    def sample(self) -> None:
        """NVML reports current use only: sampled after each batch, the largest is kept."""
        if self.nvml is not None:
            used = int(self._pynvml.nvmlDeviceGetMemoryInfo(self.nvml).used)
            self.nvml_peak = max(self.nvml_peak, used)

    def reset(self) -> None:
        self.torch.cuda.synchronize(self.index)
        self.torch.cuda.reset_peak_memory_stats(self.index)
        self.nvml_peak = 0

    def current(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.index))

    def peak(self) -> dict[str, int]:
        self.torch.cuda.synchronize(self.index)
        out = {"peak_bytes": int(self.torch.cuda.max_memory_allocated(self.index)),
               "peak_reserved_bytes": int(self.torch.cuda.max_memory_reserved(self.index))}
        if self.nvml is not None:
            out["nvml_used_bytes"] = self.nvml_peak
        return out


def cores_used() -> int:
    """CPU cores the measurement keeps busy: torch's intra-op threads, within this process's CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    torch = sys.modules.get("torch")
    return max(1, min(cpus, torch.get_num_threads())) if torch is not None else cpus


def device_price(home_root: Path | None, device_type: str, cores: int) -> tuple[float, str]:
    """USD per hour of the device from the pricing catalog (home overrides included);
    the CPU is priced per core-hour times the cores used."""
    from ..placement.pricing import CPU, Prices

    prices = Prices.resolve(home_root)
    if device_type == CPU:
        per = prices.per_hour(CPU)
        return per * cores, f"catalog: {per:g} USD/core-hour x {cores} cores"
    return prices.per_hour(device_type), f"catalog: {device_type}"


# -- the recommendation --------------------------------------------------------------------
def recommend(batches: Sequence[Mapping[str, Any]], capacity_bytes: int,
              slack: float = SLACK, key: str = "items_per_s") -> int | None:
    """The batch size that is cheapest per item among those whose peak stays under
    ``(1 - slack) * capacity_bytes``; None when none does.

    At one device price the cheapest per item is the highest items/s (``key``;
    a generate handler's profile ranks by ``tokens_per_s``, the cheapest per
    token); a tie goes to the smaller batch (less memory, shorter latency). A batch's peak is
    the largest of its measured figures (``peak_bytes``, and on CUDA the
    reserved peak and NVML's used memory, which count the allocator's cache and
    the CUDA context).
    """
    usable = capacity_bytes * (1 - slack)
    fitting = [b for b in batches if _device_peak(b) <= usable and b.get(key)]
    if not fitting:
        return None
    best = max(fitting, key=lambda b: (float(b[key]), -int(b["batch_size"])))
    return int(best["batch_size"])


def _device_peak(b: Mapping[str, Any]) -> float:
    return max(float(b.get(k) or 0) for k in ("peak_bytes", "peak_reserved_bytes", "nvml_used_bytes"))


# -- the measurement -----------------------------------------------------------------------
def with_device(handler: ModelHandler[Any], device: str) -> ModelHandler[Any]:
    """A copy of ``handler`` that loads onto ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``)."""
    if not _DEVICE.match(device):
        raise UsageError(f"--device must be auto, cpu, cuda or cuda:N, not {device!r}")
    h = copy.copy(handler)
    h.device = device
    return h


def measure(handler: ModelHandler[Any], *, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
            items: int = DEFAULT_ITEMS, inputs: Sequence[Any] | None = None,
            price_per_hour: float | None = None, home_root: Path | None = None,
            on_batch: Callable[[dict[str, Any]], None] | None = None,
            clock: Callable[[], float] | None = None) -> dict[str, Any]:
    """Measure ``handler`` on its device; returns a version-1 profile (not saved).

    Each batch size runs ``max(ceil(items / b), 3)`` batches of consecutive
    inputs; the first is the cold one (``first_batch_s``), the rest (a *round*)
    give the steady throughput and the p50/p95 latency. A round whose p95 is
    more than ``MAX_SPREAD`` times its p50 is measured again, up to
    ``MAX_ROUNDS`` rounds (:mod:`segue.inference.stability`); the profile says
    per batch size whether it settled (``stable``) and, at the top, whether all
    did. ``inputs`` defaults to :func:`sample_inputs`. ``price_per_hour``
    defaults to the catalog's price of the device type (:func:`device_price`).
    ``clock`` (seconds) defaults to the handler's own ``bench_clock`` when it has
    one (a model whose time is not this process's, a simulated one), else
    ``time.perf_counter``.
    """
    if clock is None:
        clock = getattr(handler, "bench_clock", None) or time.perf_counter
    if items < 1:
        raise UsageError(f"--items must be >= 1, not {items}")
    sizes = sorted(set(batch_sizes))
    device = handler.resolve_device()
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise UsageError(f"--device {device}: torch sees no CUDA device here; use --device cpu")
    mem: CpuMemory | CudaMemory = CudaMemory(device) if device.startswith("cuda") else CpuMemory()
    before = mem.current()
    mem.reset()
    t0 = clock()
    raw = handler.load_model()
    load_s = clock() - t0
    generate = bench_generate.is_generate(handler)
    after = mem.current()
    load_peak = mem.peak()["peak_bytes"]
    try:
        need = max(max(math.ceil(items / b), MIN_BATCHES) * b for b in sizes)
        pool = list(inputs) if inputs is not None else sample_inputs(handler, raw, need)
        device_type = device_type_of(device)
        cores = cores_used()
        source = "--price"
        if price_per_hour is None:
            price_per_hour, source = device_price(home_root, device_type, cores)
        results = []
        for b in sizes:
            n_batches = max(math.ceil(items / b), MIN_BATCHES)
            if generate:  # time to first token, prefill and decode tokens/s (bench_generate)
                r = bench_generate.measure_batch(handler, raw, mem, pool, b, n_batches, clock,
                                                 _sync(device))
                r["cost_per_million_tokens"] = bench_generate.cost_per_million_tokens(
                    price_per_hour, r["tokens_per_s"])
            else:
                r = _measure_batch(handler, raw, mem, pool, b, n_batches, clock)
            r["cost_per_1k_items"] = _cost(price_per_hour, r["items_per_s"])
            results.append(r)
            if on_batch is not None:
                on_batch(r)
        capacity, cap_source = _capacity(device)
        for r in results:
            r["fits"] = _device_peak(r) <= capacity * (1 - SLACK)
        profile = {
            "v": PROFILE_VERSION, "handler": handler.name, "version": handler.version,
            "class": f"{type(handler).__module__}.{type(handler).__qualname__}",
            "config": json.loads(json.dumps(handler.config(), default=str)),
            "device": device, "device_type": device_type, "device_name": _device_name(device),
            "capacity_bytes": capacity, "capacity_source": cap_source, "slack": SLACK,
            "threads": cores, "price_per_hour": price_per_hour, "price_source": source,
            "load_s": round(load_s, 4), "memory_before_load_bytes": before,
            "memory_after_load_bytes": after, "load_peak_bytes": load_peak,
            "model_bytes": handler.model_bytes(raw), "peak_method": mem.method,
            "items": items, "input": "given" if inputs is not None else "generated",
            "batches": results,
            "stable": all(r["stable"] for r in results), "max_spread": MAX_SPREAD,
            "recommended_batch_size": recommend(results, capacity,
                                                key="tokens_per_s" if generate else "items_per_s"),
            "recommendation": bench_generate.RECOMMENDATION.format(pct=f"{1 - SLACK:.0%}") if generate
            else f"highest items/s (cheapest per item) among batch sizes whose peak "
                 f"is under {1 - SLACK:.0%} of capacity",
            "measured_at": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if generate:
            profile["kind"] = bench_generate.KIND
            profile["max_new_tokens"] = handler.options.max_new_tokens  # type: ignore[attr-defined]
    finally:
        handler.release(raw)
    return profile


def _measure_batch(handler: ModelHandler[Any], raw: Any, mem: CpuMemory | CudaMemory,
                   pool: Sequence[Any], b: int, n_batches: int,
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    batches = [[pool[(i * b + j) % len(pool)] for j in range(b)] for i in range(n_batches)]
    sync = _sync(handler.resolve_device())
    mem.reset()

    def timed(batch: Sequence[Any]) -> float:
        t = clock()
        out = handler.run_inference(batch, raw)
        sync()
        took = clock() - t
        if isinstance(mem, CudaMemory):
            mem.sample()
        if len(out) != len(batch):
            raise UsageError(f"handler {handler.name!r} returned {len(out)} outputs for a batch "
                             f"of {len(batch)}; run_inference must return one per input")
        return took

    first = timed(batches[0])  # the cold batch, once
    rounds = [[timed(batch) for batch in batches[1:]]]
    while again(rounds):  # a noisy round is measured again, a bounded number of times
        rounds.append([timed(batch) for batch in batches[1:]])
    verdict = settle(rounds)
    steady = rounds[verdict.round]
    r: dict[str, Any] = {"batch_size": b, "batches": n_batches, "items": b * n_batches,
                         **mem.peak(),
                         "first_batch_s": round(first, 6),
                         "items_per_s": round(b * len(steady) / sum(steady), 3),
                         # the lower median, as the spread's (segue.inference.stability.spread)
                         "p50_batch_s": round(statistics.median_low(steady), 6),
                         "p95_batch_s": round(p95(steady), 6),
                         "spread": round(verdict.spread, 3), "rounds": verdict.rounds,
                         "stable": verdict.stable}
    seq = _seq_len(raw, batches)
    if seq is not None:
        r["seq_len"] = seq
    return r


def _cost(price_per_hour: float | None, items_per_s: float) -> float | None:
    if price_per_hour is None or items_per_s <= 0:
        return None
    return float(f"{price_per_hour / 3600 / items_per_s * 1000:.6g}")


def _sync(device: str) -> Callable[[], None]:
    if not device.startswith("cuda"):
        return lambda: None
    import torch

    return torch.cuda.synchronize


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
        return str(torch.cuda.get_device_name(index))
    try:
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        m = None
    return m.group(1).strip() if m else "cpu"


def _tokenizer(raw: Any) -> Any:
    tok = getattr(raw, "tokenizer", None)  # sentence-transformers
    if tok is None and isinstance(raw, tuple) and raw and callable(raw[0]):
        tok = raw[0]  # TransformersHandler: (tokenizer, model)
    return tok if callable(tok) else None


def _seq_len(raw: Any, batches: Sequence[Sequence[Any]]) -> int | None:
    """The longest padded sequence among the batches (tokens), for text models with a tokenizer."""
    tok = _tokenizer(raw)
    if tok is None or not batches or not all(isinstance(x, str) for x in batches[0]):
        return None
    limit = getattr(raw, "max_seq_length", None) or getattr(tok, "model_max_length", None) or 512
    longest = max(len(ids) for batch in batches for ids in tok(list(batch))["input_ids"])
    return int(min(longest, limit))


# -- the planner beside the measurement -------------------------------------------------------
def planner_curve(handler: ModelHandler[Any], profile: Mapping[str, Any]) -> dict[str, Any]:
    """The planner's peak per measured batch size, beside the measurement.

    When the handler's model is known to the planner (a preset named like the
    handler, or the ``config.json`` in the handler's directory) and the batches
    have a ``seq_len``: ``predict_peak_bytes`` at fp32 (the handlers load fp32
    unless told otherwise), plus on the CPU the process RSS after the load less
    the weights (the formula counts tensors; RSS counts the whole process, its
    libraries included). Otherwise the
    profile's own line (:func:`~segue.inference.plan.fit_profile`).
    """
    from . import models
    from .plan import fit_profile, predict_peak_bytes

    model = None
    try:
        model = models.preset(handler.name)
    except UsageError:
        path = getattr(handler, "path", None)
        if path is not None and (Path(path) / "config.json").is_file():
            try:
                model = models.load_config(Path(path) / "config.json")
            except UsageError:
                model = None
    batches = profile["batches"]
    if model is not None and all("seq_len" in b for b in batches):
        offset = 0
        if not profile["device"].startswith("cuda"):  # the process without the model's weights
            offset = int(profile["memory_after_load_bytes"]) - int(profile.get("model_bytes") or 0)
        dtype = getattr(handler, "dtype", None) or "fp32"
        quant = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
        pts = [(int(b["batch_size"]), offset + predict_peak_bytes(
            model, batch=int(b["batch_size"]), seq_len=int(b["seq_len"]), quant=quant))
            for b in batches]
        label = f"planner formula ({model.name}, {quant})" + (
            "" if offset == 0 else " + process RSS without the weights")
        return {"method": "formula", "label": label, "points": pts}
    fit = fit_profile(profile)
    return {"method": "profile fit", "label": "linear fit of the measured peaks",
            "points": [(int(b["batch_size"]), fit.peak_bytes(int(b["batch_size"]))) for b in batches]}


def plot(profile: Mapping[str, Any], path: str | os.PathLike[str],
         prediction: Mapping[str, Any]) -> None:
    """A PNG: items/s (left axis) and peak memory (right axis, log) against batch size, with the
    device's capacity and the planner's prediction (a generate profile: ``bench_generate.plot``)."""
    if profile.get("kind") == bench_generate.KIND:
        bench_generate.plot(profile, os.fspath(path), SLACK)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bs = [b["batch_size"] for b in profile["batches"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        ax.plot(bs, [b["items_per_s"] for b in profile["batches"]], "o-", color="tab:blue",
                label="items/s (measured)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("items/s", color="tab:blue")
        mx = ax.twinx()
        # GB (10^9 bytes), as the bench-model table and `segue plan` print them (segue.units)
        gb = UNITS[PLOT_UNIT]
        mx.plot(bs, [b["peak_bytes"] / gb for b in profile["batches"]], "s-", color="tab:red",
                label="peak memory (measured)")
        px, py = zip(*prediction["points"], strict=True)
        mx.plot(px, [y / gb for y in py], "x--", color="tab:orange", label=prediction["label"])
        cap = profile["capacity_bytes"] / gb
        mx.axhline(cap, color="black", linestyle=":",
                   label=f"capacity {in_unit(profile['capacity_bytes'], PLOT_UNIT, 1)}")
        mx.axhline(cap * (1 - SLACK), color="gray", linestyle=":", label="capacity - 10%")
        mx.set_yscale("log")
        mx.set_ylabel(f"peak memory ({PLOT_UNIT}, log)", color="tab:red")
        rec = profile.get("recommended_batch_size")
        if rec:
            ax.axvline(rec, color="green", alpha=0.3, linewidth=6, label=f"recommended {rec}")
        lines = ax.get_legend_handles_labels()
        more = mx.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
        ax.set_title(f"{profile['handler']}@{profile['version']} on {profile['device_type']}")
        fig.tight_layout()
        fig.savefig(os.fspath(path), format="png", dpi=100)
    finally:
        plt.close(fig)
