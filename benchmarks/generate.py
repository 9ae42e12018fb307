"""Batch-generation benchmark: a small causal LM, greedy, over a corpus of prompts; segue vs its peers.

    python -m benchmarks.generate --quick --json
    python -m benchmarks.generate --smoke --json       # tiny, no peers: checks it runs

The model is a random Llama written by ``segue.inference.testing.tiny_causal_lm``
(nothing is downloaded; ``--quick``: 4 layers, hidden 256, vocabulary 1024;
``--smoke``: the 2-layer test model). Every side reads the same ``N`` prompts
(JSONL ``{"id", "prompt"}``), generates ``--new-tokens`` tokens greedily for
each in the same consecutive batches of ``B``, writes Parquet ``{"id",
"token_ids", "text", "finish_reason"}`` and fsyncs it. Before any ratio, every
side's token ids are checked equal to the plain loop's, request by request; a
difference aborts the run.

* ``plain``: segue's own decode path without its engine: one process loads the
  model with ``TransformersGenerateHandler.load_model`` and calls its
  ``run_inference`` batch after batch (segue's decode loop,
  ``segue.inference.decode``, no checkpoint offers), then writes one Parquet
  file. segue does not call ``model.generate()`` (its decode loop draws per
  request and stops between tokens for checkpoints), so this is the plain
  loop of the same decode path: ``vs_plain_generate`` is segue's engine
  overhead.
* ``hf``: the same loop with transformers' own ``model.generate(do_sample=False)``
  on the left-padded batch (tokens cut after the first end-of-sequence), what a
  user without segue would write; ``vs_hf_generate`` (no goal) compares the
  decode loops as well as the engine (not run by ``--smoke``).
* ``segue``: ``segue run benchmarks/flows/generate_flow.py`` for real (store,
  controller, worker process, model loaded once per attempt, a checkpoint offer
  every 16 tokens, a checkpoint every 2 s, exactly-once Parquet sink).
* ``ray``: Ray Data ``read_json -> map_batches(Generate, batch_size=B,
  concurrency=P) -> write_parquet`` with the model loaded once per actor and
  ``model.generate(do_sample=False)``, one read block, order preserved (so its
  batches are the others'); its pool P in {1, 2} is swept first on a part of
  the prompts and the faster one is timed. Ray runs in ``--peer-python``
  (default: this interpreter, whose dev install has Ray); without Ray there it
  is skipped and ``not_measured`` says why.

Threads are equal: 2 torch intra-op threads per side in all (a Ray pool of P
actors: 2 // P each). ``work_s``: segue from the task's start to its success in
the store (worker start, imports and model load included; the CLI and the
controller not); the others from before importing torch to the fsynced output
(``ray.init`` not included). Every side gets the same ``--reps`` tries,
interleaved (round i runs every side once); a ratio is the median over i of
segue's try i against the other side's try i, with its range
(``*_tries``: median, min, max, and the best try against the best try); ratios
use ``work_s``. ``decode_tokens_per_s`` is segue's generated tokens over its
best ``work_s``.

``pause_s``: a segue run (probe on, see the flow) is paused with ``segue pause
--wait`` once its worker is inside its second batch, mid-generation; the figure
is the run's PAUSING event (the request, recorded by the CLI) to its PAUSED
event; ``pause_cli_s`` is the whole ``segue pause --wait`` command. A pause and
a preemption park the same way (the scheduler moves a victim to PAUSING as
the CLI does), at the next checkpoint offer. ``segue resume`` then finishes the
run; its output is checked like the others'. ``tokens_regenerated_after_preemption``
is the tokens every attempt generated itself (counted by the flow each time
the handler hands over its tokens, which it does at every checkpoint offer,
where a pause parks) less the tokens published: the work the interruption
cost. ``model_reload_s`` is the resumed attempt's model load.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from . import _probe as pb
from .pipeline import _subprocess_json

FLOW = Path(__file__).parent / "flows" / "generate_flow.py"
ROOT = Path(__file__).resolve().parent.parent
STEP = "generate"
THREADS = 2
POOLS = (1, 2)
QUICK_MODEL = {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "vocab": 1024}
SMOKE_MODEL: dict[str, int] = {}  # tiny_causal_lm's defaults: the 2-layer test model
CHUNK = 16

_WORDS = ("the model reads a prompt and writes tokens one at a time while the cache keeps keys and values "
          "batch pipelines resume after a pause where they stopped report summary question answer").split()


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), **more}


# -- input and verification ---------------------------------------------------------
def make_prompts(where: Path, n: int) -> Path:
    """``n`` deterministic prompts of 3 to 24 words (so the batches pad on the left)."""
    import random

    where.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    path = where / "prompts.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 24)))
            f.write(json.dumps({"id": f"r{i:05d}", "prompt": f"request {i}: {words}"}) + "\n")
    return path


def read_tokens(out: Path) -> dict[str, list[int]]:
    """``{id: token_ids}`` of every Parquet file under ``out`` (a duplicate id aborts)."""
    import pyarrow.parquet as pq

    files = [out] if out.is_file() else sorted(
        p for p in out.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in p.relative_to(out).parts))
    got: dict[str, list[int]] = {}
    for f in files:
        t = pq.read_table(f, columns=["id", "token_ids"])
        for rid, ids in zip(t.column("id").to_pylist(), t.column("token_ids").to_pylist(), strict=True):
            if rid in got:
                raise SystemExit(f"{out}: request {rid} written twice: no ratio")
            got[str(rid)] = [int(x) for x in ids]
    return got


def check(name: str, out: Path, ref: dict[str, list[int]]) -> int:
    """The generated tokens of ``out``, after checking them equal to the reference's."""
    got = read_tokens(out)
    if not ref:
        raise SystemExit(f"{name}: the reference holds no completion, so nothing would be compared")
    if set(got) != set(ref):
        raise SystemExit(f"{name}: wrote {len(got)} completions, expected each of {len(ref)} once: no ratio")
    differ = [rid for rid in ref if got[rid] != ref[rid]]
    if differ:
        raise SystemExit(f"{name}: the token ids of {len(differ)} of {len(ref)} requests differ from the "
                         f"plain loop's (first: {differ[0]}): no ratio")
    return sum(len(v) for v in got.values())


# -- the sides ------------------------------------------------------------------------
_HEAD = '''
import json, os, sys, time
cfg = json.loads(sys.argv[1])
recs = [json.loads(line) for line in open(cfg["input"])]
import pyarrow as pa, pyarrow.parquet as pq

def fsync(path):
    fd = os.open(path, os.O_RDONLY); os.fsync(fd); os.close(fd)

def write(rows, out):
    pq.write_table(pa.table({k: [r[k] for r in rows] for k in ("id", "token_ids", "text", "finish_reason")}), out)
    fsync(out); fsync(os.path.dirname(out))
'''

PLAIN = _HEAD + '''
t0 = time.perf_counter()  # the model library's import is part of the load, as on every side
import torch
from segue.inference.handlers import TransformersGenerateHandler
h = TransformersGenerateHandler(cfg["model"], max_new_tokens=cfg["new_tokens"], device="cpu")
model = h.load_model()
rows = []
for i in range(0, len(recs), cfg["batch"]):
    rows += h.run_inference(recs[i:i + cfg["batch"]], model)
write(rows, cfg["out"])
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
'''

_HF = '''
def load_hf(path, threads):
    import torch, transformers as tf
    torch.set_num_threads(threads)
    tok = tf.AutoTokenizer.from_pretrained(path, local_files_only=True)
    tok.padding_side = "left"
    net = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    return tok, net

def hf_generate(tok, net, ids, prompts, new_tokens):
    import torch
    enc = tok(list(prompts), return_tensors="pt", padding=True)
    with torch.inference_mode():
        out = net.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    rows = []
    for rid, row in zip(ids, out[:, enc["input_ids"].shape[1]:].tolist()):
        stop = tok.eos_token_id in row
        row = row[: row.index(tok.eos_token_id) + 1] if stop else row
        text = tok.decode(row[:-1] if stop else row, skip_special_tokens=True)
        rows.append({"id": str(rid), "token_ids": row, "text": text,
                     "finish_reason": "stop" if stop else "length"})
    return rows
'''

HF = _HEAD + _HF + '''
t0 = time.perf_counter()
import torch
tok, net = load_hf(cfg["model"], cfg["threads"])
rows = []
for i in range(0, len(recs), cfg["batch"]):
    chunk = recs[i:i + cfg["batch"]]
    rows += hf_generate(tok, net, [r["id"] for r in chunk], [r["prompt"] for r in chunk], cfg["new_tokens"])
write(rows, cfg["out"])
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
'''

RAY = _HEAD + _HF + '''
import ray
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)  # its own cluster
import ray.data
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
ctx.execution_options.preserve_order = True  # the same consecutive batches as every side

class Generate:
    def __init__(self, path, threads, new_tokens):
        self.tok, self.net = load_hf(path, threads)
        self.new_tokens = new_tokens
    def __call__(self, batch):
        rows = hf_generate(self.tok, self.net, batch["id"], batch["prompt"], self.new_tokens)
        return {k: [r[k] for r in rows] for k in ("id", "token_ids", "text", "finish_reason")}

def fsync_tree(root):
    for d, _, fs in os.walk(root):
        for f in fs:
            fsync(os.path.join(d, f))
        fsync(d)

runs = []
for i, pool in enumerate(cfg["pools"]):
    out = os.path.join(cfg["out"], f"pool-{pool}")
    t0 = time.perf_counter()
    ds = ray.data.read_json(cfg["input"], override_num_blocks=1)
    ds = ds.map_batches(Generate, fn_constructor_args=(cfg["model"], max(1, cfg["threads"] // pool),
                                                       cfg["new_tokens"]),
                        batch_size=cfg["batch"], concurrency=pool, num_cpus=1, batch_format="pandas")
    ds.write_parquet(out)
    fsync_tree(out)
    runs.append({"pool": pool, "seconds": time.perf_counter() - t0, "out": out})
print(json.dumps({"runs": runs}))
'''


class Bench:
    def __init__(self, work: Path, inp: Path, model: Path, batch: int, new_tokens: int,
                 peer_python: str, peer_timeout: float) -> None:
        self.work, self.inp, self.model, self.batch, self.new_tokens = work, inp, model, batch, new_tokens
        self.peer_python, self.peer_timeout = peer_python, peer_timeout
        self.home = work / "segue-home"
        self.n_run = 0
        self.cli = [sys.executable, "-m", "segue", "--home", str(self.home)]
        self.env = _env(BENCH_GEN_MODEL=str(model), BENCH_GEN_BATCH=str(batch),
                        BENCH_GEN_TOKENS=str(new_tokens), BENCH_GEN_CHUNK=str(CHUNK))

    def _out(self, name: str) -> Path:
        self.n_run += 1
        out = self.work / "out" / f"{self.n_run:04d}-{name}"
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def _cfg(self, out: Path, inp: Path | None = None, **more: Any) -> str:
        return json.dumps({"input": str(inp or self.inp), "out": str(out), "model": str(self.model),
                           "batch": self.batch, "new_tokens": self.new_tokens, "threads": THREADS, **more})

    def script(self, name: str, code: str) -> tuple[dict[str, Any], Path]:
        out = self._out(name).with_suffix(".parquet")
        got, wall, err = _subprocess_json([sys.executable, "-c", code, self._cfg(out)], timeout=3600,
                                          env=self.env)
        if got is None:
            raise SystemExit(f"{name} loop {err}")
        return {"work_s": got["seconds"], "wall_s": wall, "threads": got["threads"]}, out

    def segue(self, run_id: str | None = None, probe: Path | None = None) -> tuple[dict[str, Any], Path]:
        out = self._out("segue")
        run_id = run_id or f"bench-{self.n_run}"
        got, wall, err = _subprocess_json(
            self.cli + ["run", str(FLOW), "--run-id", run_id, "-p", f"input={self.inp}", "-p", f"out={out}"],
            timeout=3600, env=self.env)
        if got is None:
            raise SystemExit(f"segue run {err}")
        return {"work_s": self.work_s(run_id), "wall_s": wall}, out

    def work_s(self, run_id: str) -> float:
        from segue.home import Home

        task = Home.resolve(self.home).open_store().get_task(run_id, STEP)
        if task.started_at is None or task.finished_at is None:
            raise SystemExit(f"segue run {run_id}: the task has no start or finish time")
        return float(task.finished_at - task.started_at)

    def ray(self, pools: tuple[int, ...], inp: Path | None = None) -> tuple[list[dict[str, Any]] | None, str]:
        out = self._out("ray")
        got, _, err = _subprocess_json([self.peer_python, "-c", textwrap.dedent(RAY),
                                        self._cfg(out, inp, pools=list(pools))],
                                       timeout=self.peer_timeout, env=self.env)
        return (None, err) if got is None else (got["runs"], "")


# -- pause mid-generation, then resume ---------------------------------------------------
def pause_resume(bench: Bench, ref: dict[str, list[int]]) -> dict[str, Any]:
    from segue.home import Home
    from segue.states import RunState

    work = bench.work / f"pause-{bench.n_run}"
    probe, out, run_id = work / "probe", work / "out", f"pause-{bench.n_run}"
    probe.mkdir(parents=True)
    cli, env = bench.cli, bench.env
    run = subprocess.Popen(cli + ["run", str(FLOW), "--run-id", run_id, "-p", f"input={bench.inp}",
                                  "-p", f"out={out}", "-p", f"probe={probe}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:  # gate on observed progress: inside the second batch, between two tokens
        pb.wait_until(lambda: (probe / "mid").exists() or run.poll() is not None, timeout=1800, poll=0.01)
        if run.poll() is not None:
            assert run.stderr is not None  # stderr=PIPE
            raise SystemExit(f"segue run ended before its second batch: {run.stderr.read()[-300:]}")
        t_cli = time.time()
        subprocess.run(cli + ["pause", run_id, "--wait"], check=True, capture_output=True, timeout=600, env=env)
        pause_cli_s = time.time() - t_cli
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    store = Home.resolve(bench.home).open_store()
    if store.get_run(run_id).state != RunState.PAUSED:
        raise SystemExit(f"run {run_id} is {store.get_run(run_id).state}, not PAUSED")
    res = subprocess.run(cli + ["resume", run_id], capture_output=True, text=True, timeout=3600, env=env)
    if res.returncode:
        raise SystemExit(f"segue resume failed: {res.stderr.strip()[-500:]}")
    published = check("pause/resume", out, ref)
    made = sum(int(p.read_text() or 0) for p in probe.glob("tokens-*"))
    events = store.list_events(run_id)
    pausing = next(e.time for e in events if e.kind == "run" and e.to_state == "PAUSING")
    paused = next(e.time for e in events if e.kind == "run" and e.to_state == "PAUSED")
    loads = [e.data for e in store.list_events(run_id, kinds=["model"]) if "seconds" in e.data]
    reloads = [d["seconds"] for d in loads if d.get("reload")]
    return {"pause_s": paused - pausing, "pause_cli_s": pause_cli_s,
            "tokens_generated": made, "tokens_published": published,
            "tokens_regenerated_after_preemption": made - published, "attempts": len(list(probe.glob("tokens-*"))),
            "model_reload_s": reloads[0] if reloads else None, "output_verified": True}


# -- main ------------------------------------------------------------------------------
GOALS = {  # key: (comparison, target)
    "vs_plain_generate": (">=", 0.9),
    "vs_ray_data": (">=", 1.0),
    "pause_s": ("<=", 2.0),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.generate")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="256 prompts x 64 tokens, a 4-layer model, 3 tries")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes, one try, no peers: checks the benchmark runs (CI)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line at the end")
    ap.add_argument("--prompts", type=int, default=None, help="prompts (default 1024; quick 256)")
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per prompt (default 64; smoke 20)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per batch, every side (default 16)")
    ap.add_argument("--reps", type=int, default=None, help="tries per side (default 3; smoke 1)")
    ap.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON", sys.executable))
    ap.add_argument("--peer-timeout", type=float, default=1800)
    ap.add_argument("--no-peers", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        n, reps, tokens, shape, batch = a.prompts or 24, a.reps or 1, a.new_tokens or 20, SMOKE_MODEL, 8
    elif a.quick:
        n, reps, tokens, shape, batch = a.prompts or 256, a.reps or 3, a.new_tokens or 64, QUICK_MODEL, a.batch
    else:
        n, reps, tokens, shape, batch = a.prompts or 1024, a.reps or 3, a.new_tokens or 64, QUICK_MODEL, a.batch
    say = (lambda *x: None) if a.json else (lambda *x: print(*x, file=sys.stderr, flush=True))
    notes = pb.byte_compile_segue()
    not_measured: dict[str, str] = {}
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="segue-bench-gen-") as tmp:
        work = Path(tmp)
        pb.private_pool(work)  # never wait behind (or hold) other runs of this machine
        model = _build_model(work / "model", shape)
        inp = make_prompts(work / "in", n)
        bench = Bench(work, inp, model, batch, tokens, a.peer_python, a.peer_timeout)
        sides: dict[str, Any] = {"plain": lambda: bench.script("plain", PLAIN), "segue": bench.segue}
        if not a.smoke:  # transformers' own loop: a figure without a goal, left out of CI's smoke run
            sides["hf"] = lambda: bench.script("hf", HF)
        ray_pool = None
        if a.smoke or a.no_peers:
            not_measured["vs_ray_data"] = "--smoke or --no-peers: peers not run"
        else:
            sweep = make_prompts(work / "sweep", min(n, 4 * batch))
            got, err = bench.ray(POOLS, sweep)
            if got is None:
                not_measured["vs_ray_data"] = f"ray data {err} in {a.peer_python} (see benchmarks/requirements.txt)"
            else:
                ray_pool = min(got, key=lambda r: r["seconds"])["pool"]
                say(f"ray sweep: {[(r['pool'], round(r['seconds'], 2)) for r in got]}, timing pool {ray_pool}")
                sides["ray"] = lambda: bench.ray((ray_pool,))
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        ref: dict[str, list[int]] | None = None
        for rep in range(reps):  # interleaved: every side once per round
            for name, fn in sides.items():
                if name == "ray":
                    got, err = fn()
                    if got is None:
                        not_measured["vs_ray_data"] = f"ray data {err}"
                        continue
                    res: dict[str, Any] = {"work_s": got[0]["seconds"], "pool": got[0]["pool"]}
                    out = Path(got[0]["out"])
                else:
                    res, out = fn()
                if ref is None:  # the first plain run is the reference
                    ref = read_tokens(out)
                    if len(ref) != n:
                        raise SystemExit(f"the plain loop wrote {len(ref)} of {n} completions")
                res["tokens"] = check(f"{name} (try {rep + 1})", out, ref)
                res["verified"] = True
                runs[name].append(res)
                say(f"{name} try {rep + 1}: {res['tokens'] / res['work_s']:.1f} tokens/s (work {res['work_s']:.2f}s)")
                if out.is_dir():
                    shutil.rmtree(out, ignore_errors=True)
                else:
                    out.unlink()
        if "ray" in runs and not runs["ray"]:
            del runs["ray"]
        assert ref is not None
        pr = pause_resume(bench, ref)
        say(f"pause/resume: {pr}")
    summary = summarize(n, reps, batch, tokens, shape, runs, ray_pool, pr, notes, not_measured, a)
    summary["elapsed_s"] = round(time.monotonic() - t_start, 1)
    print(json.dumps(summary))


def _build_model(path: Path, shape: dict[str, int]) -> Path:
    """The random Llama, written in a child process (this one never imports torch)."""
    code = ("import json, sys; from segue.inference.testing import tiny_causal_lm; "
            "tiny_causal_lm(sys.argv[1], **json.loads(sys.argv[2]))")
    subprocess.run([sys.executable, "-c", code, str(path), json.dumps(shape)], check=True, env=_env(),
                   capture_output=True, timeout=600)
    return path


def summarize(n: int, reps: int, batch: int, tokens: int, shape: dict[str, int],
              runs: dict[str, list[dict[str, Any]]], ray_pool: int | None, pr: dict[str, Any],
              notes: list[str], not_measured: dict[str, str], a: argparse.Namespace) -> dict[str, Any]:
    def best(name: str) -> float | None:
        r = runs.get(name)
        return min(x["work_s"] for x in r) if r else None

    def ratio(x: float | None, y: float | None) -> float | None:  # a speed ratio: y's time over x's
        return round(y / x, 3) if x and y else None

    def paired(peer: str) -> dict[str, Any] | None:
        """segue against ``peer`` try by try (the tries interleave): the median and range of the ratios."""
        pairs = [ratio(s["work_s"], p["work_s"]) for s, p in zip(runs["segue"], runs.get(peer, []), strict=False)]
        got = sorted(r for r in pairs if r is not None)
        if not got:
            return None
        return {"median": round(statistics.median(got), 3), "min": got[0], "max": got[-1], "tries": len(got),
                "best_vs_best": ratio(best("segue"), best(peer))}

    seg = best("segue")
    generated = runs["segue"][0]["tokens"]
    out: dict[str, Any] = {
        "prompts": n, "new_tokens": tokens, "batch_size": batch, "tries_per_side": reps,
        "threads_per_side": THREADS, "model": {"kind": "random Llama (tiny_causal_lm)", **shape},
        "output_verified": {"completions": n, "tokens": generated, "equal_token_ids": "every side, every try",
                            "every_run_matched": all(x["verified"] for r in runs.values() for x in r)},
        "decode_tokens_per_s": round(generated / seg, 1) if seg else None,
        **{f"{k}_tokens_per_s": round(generated / b, 1) for k in runs if (b := best(k))},
        "vs_plain_generate": (pv := paired("plain")) and pv["median"],
        "vs_plain_generate_tries": pv,
        "plain_side": "segue's decode path (TransformersGenerateHandler.run_inference) in a plain loop; "
                      "segue does not call model.generate()",
        "vs_hf_generate": (hv := paired("hf")) and hv["median"],
        "vs_hf_generate_tries": hv,
        "vs_ray_data": (rv := paired("ray")) and rv["median"],
        "vs_ray_data_tries": rv,
        "ray_data_pool": ray_pool,
        "pause_s": round(pr["pause_s"], 3), "pause_cli_s": round(pr["pause_cli_s"], 3),
        "tokens_regenerated_after_preemption": pr["tokens_regenerated_after_preemption"],
        "model_reload_s": pr["model_reload_s"],
        "pause": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in pr.items()},
        "runs": {k: [{kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in x.items()} for x in v]
                 for k, v in runs.items()},
        "not_measured": not_measured,
        "cpus": os.cpu_count(),
        "notes": notes + [
            "work_s: segue from task start to success in the store (worker start, imports and model load "
            "included; CLI and controller start-up not); others from before importing torch to the fsynced "
            "output (ray.init not included); a ratio is the median over the tries of try i of segue "
            "against try i of the other side (the tries interleave), with its range",
            f"every side: {THREADS} torch threads in total, batch {batch}, greedy, the same prompts; "
            "token ids checked equal to the plain loop's before any ratio",
            f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus",
        ],
    }
    if a.smoke:
        out["notes"].append(f"--smoke: {n} prompts; figures mean nothing, the run checks the benchmark works")
    out["goals"] = pb.goals(out, GOALS)
    return out


if __name__ == "__main__":
    main()
