"""`make demo-llm`: a batch generation job gives its GPU to an urgent evaluation mid-generation, then finishes.

1. A nightly job generates 64 tokens for each of 1,200 prompts with a causal
   LM (a small random Llama made here, ``examples/llm.py``: nothing is
   downloaded) into Parquet, at batch priority, on one GPU of the host pool (a
   virtual one where the machine has none: the model then runs on the CPU).
2. Once it is a quarter done (``--preempt-at``), an urgent evaluation (the model's perplexity on
   held-out sentences) arrives and asks for the same GPU. segue preempts the
   nightly job: it parks between two tokens of the batch in flight, at a
   checkpoint holding every request's tokens so far; its worker releases the
   model and exits; the evaluation takes the device.
3. When the evaluation ends, the nightly job resumes by itself, reloads the
   model, re-prefills the interrupted requests with the tokens they had, and
   finishes.
4. An uninterrupted run of the same job proves the result: every prompt
   answered exactly once, every completion token-identical.

It prints the pause latency, the tokens generated twice, the model reload
cost and the cost per million tokens, then the nightly run's accounting.
Everything goes through segue's Python API (``segue.Client``) and its command
line, as an operator would. ``make demo`` (the embedding job) is the main
demo. ``--prompts N`` makes it smaller (the tests run it so, on the 2-layer test
model: ``SEGUE_GEN_MODEL``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import demokit  # noqa: E402 - beside this file

HOME = Path(os.environ.get("SEGUE_HOME", ROOT / ".segue"))
POOL = Path(os.environ.get("SEGUE_DEMO_POOL", HOME / "demo-llm-pool.db"))  # never the machine's pool
NIGHTLY, EVAL = ROOT / "examples" / "llm_nightly.py", ROOT / "examples" / "llm_eval.py"
PROMPTS, EVAL_TEXTS = 1200, 200


def _pool_setup(console: Any) -> None:
    demokit.pool_setup(console, HOME, POOL, "demo-llm")


def _wait(cond: Callable[[], Any], what: str, timeout: float = 900) -> Any:
    return demokit.wait(cond, what, timeout, "demo-llm")


_progress, _figures = demokit.progress, demokit.figures


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(prog="python examples/llm_batch.py")
    ap.add_argument("--prompts", type=int, default=PROMPTS, help=f"prompts to answer (default {PROMPTS})")
    ap.add_argument("--eval-texts", type=int, default=EVAL_TEXTS)
    ap.add_argument("--preempt-at", type=float, default=0.25, metavar="FRACTION",
                    help="the share of the prompts answered when the urgent run arrives (default 0.25)")
    a = ap.parse_args(argv)
    demokit.require(("torch", "transformers", "pyarrow", "rich"), "demo-llm")
    import llm
    from rich.console import Console

    from segue import Client

    console = Console()
    t_demo = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = HOME / "demo-llm-data" / stamp
    nightly, urgent, ref = f"llm-nightly-{stamp}", f"llm-eval-{stamp}", f"llm-nightly-ref-{stamp}"
    console.rule("[bold]segue demo: a batch generation job meets an urgent evaluation")
    console.print(f"home {HOME}   pool {POOL}")
    _pool_setup(console)
    t0 = time.monotonic()
    fresh = not (llm.MODEL / "config.json").is_file()
    cfg = json.loads((llm.model_dir() / "config.json").read_text())
    console.print(f"   model: a random Llama ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}) at "
                  f"{llm.MODEL}" + (f", written in {time.monotonic() - t0:.1f}s" if fresh else ""))
    prompts = write_prompts(data / "prompts.jsonl", a.prompts)
    texts = write_texts(data / "eval.jsonl", a.eval_texts)
    probe = data / "probe"
    probe.mkdir(parents=True)
    client = Client(HOME, pool=POOL)

    console.print(f"1. nightly job: {a.prompts:,} prompts x {llm.NEW_TOKENS} tokens -> a causal LM -> "
                  f"Parquet, batch priority, 1 GPU")
    client.submit(str(NIGHTLY), {"prompts": str(prompts), "out": str(data / "completions"), "probe": str(probe)},
                  run_id=nightly, priority="batch")
    _wait(lambda: _progress(client, nightly, "generate") >= a.preempt_at,
          f"the nightly job to be {a.preempt_at:.0%} done")
    console.print(f"   {_progress(client, nightly, 'generate'):.0%} of the prompts answered")

    console.print("2. an urgent evaluation arrives and asks for the same GPU")
    t_submit = time.time()
    client.submit(str(EVAL), {"texts": str(texts), "out": str(data / "eval")}, run_id=urgent, priority="urgent")
    if os.environ.get("SEGUE_DEMO_HOLD"):  # the test's gate (llm_nightly.py): the preemption is asked for
        _wait(lambda: client.status(nightly).state.value in ("PAUSING", "PAUSED"), "the preemption")
        Path(os.environ["SEGUE_DEMO_HOLD"]).touch()
    client.wait(urgent, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=600)
    report = client.output(urgent, "report")
    console.print(f"   evaluation: {report['texts']} texts, {report['tokens']:,} tokens, perplexity "
                  f"{report['perplexity']} (a random model: about its vocabulary's size)")

    console.print("3. the nightly job resumes by itself")
    client.wait(nightly, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=1800)
    figures = _figures(list(client.events(nightly)), list(client.events(urgent)), t_submit)

    console.print("4. an uninterrupted run of the same job, to compare")
    t0 = time.monotonic()
    client.submit(str(NIGHTLY), {"prompts": str(prompts), "out": str(data / "reference"), "probe": ""},
                  run_id=ref, priority="batch")
    client.wait(ref, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=1800)
    ref_s = time.monotonic() - t0
    got, want = _tokens(data / "completions"), _tokens(data / "reference")
    once = sorted(got) == sorted(str(i) for i in range(a.prompts)) and got.n == a.prompts
    same = once and all(got[k] == want.get(k) for k in got)
    published = sum(len(v) for v in got.values())
    made = sum(int(p.read_text() or 0) for p in probe.glob("tokens-*"))
    figures.update(published=published, twice=made - published, attempts=len(list(probe.glob("tokens-*"))),
                   differ=sum(got[k] != want.get(k) for k in got))
    acct = client.status(nightly).accounting
    figures["usd"] = float(acct["cost"]["so_far"])

    _report(console, client, nightly, a.prompts, figures, same, once, ref_s, time.monotonic() - t_demo)
    ok = (same and once and figures["preempted"]
          and all(client.status(r).state.value == "SUCCEEDED" for r in (nightly, urgent, ref)))
    console.print("[bold green]demo passed[/bold green]" if ok else "[bold red]demo FAILED[/bold red]")
    shutil.rmtree(data / "reference", ignore_errors=True)
    return 0 if ok else 1


def write_prompts(path: Path, n: int, seed: int = 5) -> Path:
    """``n`` prompts (``{"id", "prompt"}``) of different lengths, deterministic for the seed."""
    from corpus import sentence

    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            ask = rng.choice(("summarise", "explain", "continue", "answer"))
            body = ". ".join(sentence(rng) for _ in range(rng.randint(1, 3)))
            f.write(json.dumps({"id": i, "prompt": f"{ask}: {body}."}) + "\n")
    return path


def write_texts(path: Path, n: int) -> Path:
    from corpus import write_corpus

    return write_corpus(path, n, seed=13)


class _Completions(dict[str, list[int]]):
    n = 0  # rows read, duplicates included


def _tokens(out: Path) -> _Completions:
    import pyarrow.parquet as pq

    got = _Completions()
    for p in sorted(out.glob("part-*.parquet")):
        for r in pq.read_table(p, columns=["id", "token_ids"]).to_pylist():
            got[str(r["id"])] = list(r["token_ids"])
            got.n += 1
    return got










def _report(console: Any, client: Any, nightly: str, n: int, f: dict[str, Any], same: bool, once: bool,
            ref_s: float, total_s: float) -> None:
    from rich.table import Table

    from segue.cli.costs import accounting_lines

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}s"

    t = Table(title="the nightly generation job, interrupted")
    t.add_column("figure")
    t.add_column("value")
    t.add_row("preempted by the urgent run", "[green]yes[/green]" if f["preempted"] else "[red]NO[/red]")
    t.add_row("pause latency (PAUSING -> PAUSED, between two tokens)", secs(f["pause_s"]))
    t.add_row("urgent run: submit -> its step running on the GPU", secs(f["to_device_s"]))
    t.add_row("tokens generated twice (generated by every attempt - published)",
              f"{f['twice']:,} of {f['published']:,} ({f['attempts']} attempts)")
    t.add_row("model loads / reload cost after the preemption", f"{f['loads']} / {secs(f['reload_s'])}")
    per_m = f["usd"] / f["published"] * 1e6 if f["published"] else float("nan")
    t.add_row("cost per million tokens (the run's device cost / tokens published)",
              f"${per_m:.4f} (${f['usd']:.6f} for {f['published']:,} tokens)")
    t.add_row(f"{n:,} prompts answered exactly once", "[green]yes[/green]" if once else "[red]NO[/red]")
    t.add_row("completions token-identical to the uninterrupted run",
              "[green]yes[/green]" if same else f"[red]NO[/red] ({f['differ']} completions differ)")
    t.add_row("uninterrupted run took", secs(ref_s))
    t.add_row("the whole demo took", secs(total_s))
    console.print(t)
    console.print(f"   {f['pause_reason']}")
    console.print(f"accounting of {nightly} (segue status {nightly}):")
    for line in accounting_lines(client.status(nightly).accounting):
        console.print(line, markup=False, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
