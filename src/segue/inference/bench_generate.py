"""What ``segue bench-model`` measures of a generate handler, per batch size.

A generate handler (``TransformersGenerateHandler``, ``VLLMHandler``: any
handler whose ``options`` are :class:`~segue.inference.handlers.generate.GenerateOptions`)
turns a batch of prompts into completions that carry ``prompt_tokens`` and
``completion_tokens``. Each timed batch runs twice, on the same prompts: first
with ``max_new_tokens=1`` (a copy of the handler: the prefill and one token,
which is the batch's **time to first token**), then whole. So, per batch size,
over the steady batches:

- ``ttft_p50_s``: the lower median of the first-token times;
- ``prefill_tokens_per_s``: prompt tokens over the first-token times;
- ``decode_tokens_per_s``: the tokens after each request's first, over the
  whole runs' time less their first-token time;
- ``tokens_per_s``: every generated token over the whole runs' time (what a
  token costs: ``cost_per_million_tokens``), and ``items_per_s`` (requests);
- ``p50_batch_s``/``p95_batch_s``/``spread``: the whole runs' latencies, which
  decide, as for any handler, whether a round is measured again
  (:mod:`segue.inference.stability`).

The recommendation is the batch with the most tokens/s (the cheapest per
token) among those that fit. This module only measures; it never prints.
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import UsageError
from .handler import ModelHandler
from .stability import again, p95, settle

KIND = "generate"
RECOMMENDATION = "highest tokens/s (cheapest per token) among batch sizes whose peak is under {pct} of capacity"


def is_generate(handler: ModelHandler[Any]) -> bool:
    """Whether ``handler`` generates (its options are the generate handlers' own)."""
    from .handlers.generate import GenerateOptions

    return isinstance(getattr(handler, "options", None), GenerateOptions)


def first_token(handler: ModelHandler[Any]) -> ModelHandler[Any]:
    """A copy of ``handler`` that generates one token per request: prefill and the first token."""
    one = copy.copy(handler)
    one.options = dataclasses.replace(handler.options, max_new_tokens=1)  # type: ignore[attr-defined]
    return one


@dataclasses.dataclass(frozen=True)
class Timed:
    """One batch run twice: its first-token time, its whole time, and its token counts."""

    ttft_s: float
    total_s: float
    prompt_tokens: int
    completion_tokens: int
    requests: int


def measure_batch(handler: ModelHandler[Any], raw: Any, mem: Any, pool: Sequence[Any], b: int,
                  n_batches: int, clock: Callable[[], float] = time.perf_counter,
                  sync: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """One batch size of a generate handler: ``n_batches`` batches of ``b`` consecutive prompts,
    the first one cold; the figures of the module docstring."""
    batches = [[pool[(i * b + j) % len(pool)] for j in range(b)] for i in range(n_batches)]
    one = first_token(handler)
    mem.reset()

    def timed(batch: Sequence[Any]) -> Timed:
        t0 = clock()
        one.run_inference(batch, raw)
        sync()
        t1 = clock()
        out = handler.run_inference(batch, raw)
        sync()
        t2 = clock()
        if getattr(mem, "sample", None) is not None:
            mem.sample()
        done = [o for o in out if isinstance(o, Mapping) and "completion_tokens" in o]
        if len(out) != len(batch) or len(done) != len(batch):
            raise UsageError(f"handler {handler.name!r} returned {len(done)} completions for a batch of "
                             f"{len(batch)} prompts; bench-model needs one completion per prompt")
        return Timed(t1 - t0, t2 - t1, sum(int(o["prompt_tokens"]) for o in done),
                     sum(int(o["completion_tokens"]) for o in done), len(done))

    cold = timed(batches[0])
    rounds_t = [[timed(batch) for batch in batches[1:]]]
    rounds = [[t.total_s for t in rounds_t[0]]]
    while again(rounds):  # a noisy round is measured again, a bounded number of times
        rounds_t.append([timed(batch) for batch in batches[1:]])
        rounds.append([t.total_s for t in rounds_t[-1]])
    verdict = settle(rounds)
    steady = rounds_t[verdict.round]
    return {"batch_size": b, "batches": n_batches, "items": b * n_batches, **mem.peak(),
            "first_batch_s": round(cold.total_s, 6), "first_ttft_s": round(cold.ttft_s, 6),
            **figures(steady), "spread": round(verdict.spread, 3), "rounds": verdict.rounds,
            "stable": verdict.stable, "seq_len": _context(steady, handler)}


def figures(steady: Sequence[Timed]) -> dict[str, Any]:
    """The throughput and latency figures of the steady batches (the module docstring)."""
    total = sum(t.total_s for t in steady)
    ttft = sum(t.ttft_s for t in steady)
    tokens = sum(t.completion_tokens for t in steady)
    later = tokens - sum(t.requests for t in steady)  # every request's first token is the prefill's
    decode_s = total - ttft
    lat = [t.total_s for t in steady]
    return {
        "items_per_s": round(sum(t.requests for t in steady) / total, 3),
        "tokens_per_s": round(tokens / total, 3),
        "prefill_tokens_per_s": round(sum(t.prompt_tokens for t in steady) / ttft, 3) if ttft > 0 else None,
        "decode_tokens_per_s": round(later / decode_s, 3) if later > 0 and decode_s > 0 else None,
        "ttft_p50_s": round(statistics.median_low([t.ttft_s for t in steady]), 6),
        "ttft_p95_s": round(p95([t.ttft_s for t in steady]), 6),
        "p50_batch_s": round(statistics.median_low(lat), 6), "p95_batch_s": round(p95(lat), 6),
        "prompt_tokens": sum(t.prompt_tokens for t in steady), "completion_tokens": tokens,
    }


def _context(steady: Sequence[Timed], handler: ModelHandler[Any]) -> int:
    """The longest context a request of these batches can reach: its prompt plus every new token
    (an upper bound from the mean prompt; the planner's ``seq_len``)."""
    requests = sum(t.requests for t in steady) or 1
    prompt = sum(t.prompt_tokens for t in steady) / requests
    return int(round(prompt)) + int(handler.options.max_new_tokens)  # type: ignore[attr-defined]


def cost_per_million_tokens(price_per_hour: float | None, tokens_per_s: float) -> float | None:
    if price_per_hour is None or tokens_per_s <= 0:
        return None
    return float(f"{price_per_hour / 3600 / tokens_per_s * 1e6:.6g}")


def plot(profile: Mapping[str, Any], path: str, slack: float) -> None:
    """A PNG of a generate profile: tokens/s (decode, prefill, all generated; log) on the left,
    time to first token and peak memory on the right, against batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..units import UNITS, in_unit

    rows = profile["batches"]
    bs = [b["batch_size"] for b in rows]
    gb = UNITS["GB"]
    fig, (tp, lat) = plt.subplots(1, 2, figsize=(10, 4.2))
    try:
        for key, label, style in (("decode_tokens_per_s", "decode tokens/s", "o-"),
                                  ("prefill_tokens_per_s", "prefill tokens/s", "^-"),
                                  ("tokens_per_s", "generated tokens/s (end to end)", "s--")):
            pts = [(b["batch_size"], b[key]) for b in rows if b.get(key)]
            if pts:
                tp.plot(*zip(*pts, strict=True), style, label=label)
        tp.set_xscale("log", base=2)
        tp.set_yscale("log")
        tp.set_xlabel("batch size")
        tp.set_ylabel("tokens/s (log)")
        lat.plot(bs, [b["ttft_p50_s"] for b in rows], "o-", color="tab:purple", label="time to first token (p50)")
        lat.set_xscale("log", base=2)
        lat.set_xlabel("batch size")
        lat.set_ylabel("seconds", color="tab:purple")
        mem = lat.twinx()
        mem.plot(bs, [b["peak_bytes"] / gb for b in rows], "s-", color="tab:red", label="peak memory")
        cap = profile["capacity_bytes"] / gb
        mem.axhline(cap, color="black", linestyle=":",
                    label=f"capacity {in_unit(profile['capacity_bytes'], 'GB', 1)}")
        mem.axhline(cap * (1 - slack), color="gray", linestyle=":", label=f"capacity - {slack:.0%}")
        mem.set_yscale("log")
        mem.set_ylabel("peak memory (GB, log)", color="tab:red")
        rec = profile.get("recommended_batch_size")
        for ax in (tp, lat):
            if rec:
                ax.axvline(rec, color="green", alpha=0.3, linewidth=6, label=f"recommended {rec}" if ax is tp else None)
        tp.legend(fontsize=7, loc="lower right")
        h1, l1 = lat.get_legend_handles_labels()
        h2, l2 = mem.get_legend_handles_labels()
        lat.legend(h1 + h2, l1 + l2, fontsize=7, loc="center left")
        fig.suptitle(f"{profile['handler']}@{profile['version']} on {profile['device_type']}: "
                     f"{profile.get('max_new_tokens')} new tokens a request")
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
