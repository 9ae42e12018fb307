"""Data-pipeline benchmark: JSON records -> transform -> JSONL, segue vs its peers.

    python -m benchmarks.pipeline --quick --json
    python -m benchmarks.pipeline --smoke --json        # seconds; CI runs it

Every side reads the same input (``--files`` JSONL files), applies the very
same ``transform`` and writes JSONL, each in its own process:

* ``plain``: a single Python loop, its output fsynced every second and at the end
  (durable the way segue's checkpoints are);
* ``plain_2p``: two such loops at once, each on half the files: what this machine's
  cores give two workers with no engine at all. ``plain_2p_vs_plain`` is the ceiling of
  ``scale_2_workers`` here, and ``scale_2_workers_vs_machine`` how close segue comes;
* ``segue_1w`` / ``segue_2w``: ``segue run benchmarks/flows/pipeline_flow.py`` for
  real (SQLite store, controller, worker process, sub-workers for 2w, a durable
  checkpoint every second through the exactly-once JSONL sink);
* ``inprocess``: the old shortcut, labelled as such: ``run_map`` called in one
  process with a stand-in context that saves real checkpoints (no store, no
  controller);
* ``beam_1w`` / ``beam_2w``: Apache Beam's DirectRunner (in_memory, and
  multi_processing with direct_num_workers=2), and Prism when it starts here;
* ``ray_1w`` / ``ray_2w``: Ray Data with one read block per file
  (override_num_blocks), ``ray.init(num_cpus=1|2)``.

Peers run in ``--peer-python`` (their own venv) and are skipped with a note when
missing; their output is fsynced inside the timed region, like segue's.
Repetitions are interleaved and every side gets the same ``--reps`` tries; the
figure is the best of them (all runs are in the JSON). Every run's output is
checked against the plain loop's (record count and an order-independent hash of
the canonical records) before any ratio is computed; a mismatch aborts.

``work_s`` is the pipeline itself: for segue, the task's start to its success in
the store (worker process start and imports included, the CLI and controller
start-up not); for the plain loop and the peers, from before the pipeline to
the fsynced output (imports and ``ray.init`` not included). ``wall_s`` is the
whole process. Ratios use ``work_s``; the ``*_wall`` figures use ``wall_s``.

Then the resume test, through the real CLI: ``segue run`` is paused at 90% of
the input (the flow holds record 90% until the controller's pause signal
arrives, so the pause lands there on any machine), and ``segue resume`` is
timed from its start to the first record transformed by the new worker; the
resumed run's output is verified exactly-once. It runs as many times as every
throughput side (``--reps``); ``resume_at_90pct_s`` is the median, every try is
in ``resume_s_tries``.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "pipeline_flow.py"
ROOT = Path(__file__).resolve().parent.parent
STEP = "records"


def _load_flow_module() -> Any:
    spec = importlib.util.spec_from_file_location("_bench_pipeline_flow", FLOW)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(FLOW.parent))  # its helpers beside it, as `segue run` finds them
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(FLOW.parent))
    return mod


transform = _load_flow_module().transform
# Every side runs the very same function, from the flow file's source text.
TRANSFORM_SRC = "from typing import Any\n" + inspect.getsource(transform)


# -- input and verification ---------------------------------------------------------
def make_input(where: Path, n: int, files: int) -> list[Path]:
    """``n`` records split over ``files`` JSONL files (ids in file order)."""
    where.mkdir(parents=True, exist_ok=True)
    paths = [where / f"in-{k:03d}.jsonl" for k in range(files)]
    per = -(-n // files)
    for k, path in enumerate(paths):
        with open(path, "w") as f:
            buf = []
            for i in range(k * per, min(n, (k + 1) * per)):
                buf.append(json.dumps({"id": i, "text": f"record number {i} of the benchmark",
                                       "x": i * 0.5, "tag": "abcdefgh"[i % 8]}))
                if len(buf) == 10_000:
                    f.write("\n".join(buf) + "\n")
                    buf = []
            if buf:
                f.write("\n".join(buf) + "\n")
    return paths


def _output_files(out: Path) -> list[Path]:
    """Every published output file under ``out`` (a directory) or named ``out*``."""
    if out.is_dir():
        return sorted(p for p in out.rglob("*") if p.is_file()
                      and not any(part.startswith((".", "_")) for part in p.relative_to(out).parts))
    return sorted(p for p in out.parent.glob(out.name + "*") if p.is_file())


def digest(files: Iterable[Path]) -> tuple[int, str]:
    """(records, order-independent hash of the canonical records) of JSONL files.

    Each record is parsed and re-dumped with sorted keys, so two writers that
    format the same values differently (key order, spacing) agree; the hash is
    the sum of per-record blake2b values, so the order of records and files
    does not matter but a missing, extra or changed record does.
    """
    n, acc = 0, 0
    loads, dumps, blake = json.loads, json.dumps, hashlib.blake2b
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                if not line.strip():
                    continue
                canon = dumps(loads(line), sort_keys=True, separators=(",", ":")).encode()
                acc = (acc + int.from_bytes(blake(canon, digest_size=8).digest(), "little")) \
                    % (1 << 64)
                n += 1
    return n, f"{acc:016x}"


# -- the sides ----------------------------------------------------------------------
PLAIN = '''
import json, os, sys, time
files, out, every = sys.argv[1].split(","), sys.argv[2], float(sys.argv[3])
t0 = time.perf_counter()
loads, dumps = json.loads, json.dumps
with open(out, "w") as g:
    last = time.monotonic()
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                g.write(dumps(transform(loads(line))) + "\\n")
                # as durable as segue: the output is fsynced as often as it checkpoints
                if time.monotonic() - last >= every:
                    g.flush(); os.fsync(g.fileno()); last = time.monotonic()
    g.flush()
    os.fsync(g.fileno())
t1 = time.perf_counter()  # CLOCK_MONOTONIC: comparable across the processes of plain_2p
print(json.dumps({"seconds": t1 - t0, "t0": t0, "t1": t1}))
'''

_FSYNC_OUT = '''
def fsync_outputs(prefix):
    import glob
    paths = glob.glob(prefix + "*") + glob.glob(os.path.join(prefix, "**", "*"), recursive=True)
    for p in paths:
        if os.path.isfile(p):
            fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
'''

PEERS = {
    "beam": '''
import json, os, sys, time
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
files, out, workers, runner = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
if runner == "prism":
    opts = PipelineOptions(runner="PrismRunner")
elif workers > 1:
    opts = PipelineOptions(direct_num_workers=workers, direct_running_mode="multi_processing")
else:
    opts = PipelineOptions(direct_num_workers=1, direct_running_mode="in_memory")
pattern = os.path.join(os.path.dirname(files[0]), "in-*.jsonl")
t0 = time.perf_counter()
with beam.Pipeline(options=opts) as p:
    (p | beam.io.ReadFromText(pattern) | beam.Map(json.loads) | beam.Map(transform)
       | beam.Map(json.dumps) | beam.io.WriteToText(out))
fsync_outputs(out)
print(json.dumps({"seconds": time.perf_counter() - t0}))
''',
    "ray": '''
import json, os, sys, time
files, out, workers = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
t_init = time.perf_counter()
import ray
ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
import ray.data
ray.data.DataContext.get_current().enable_progress_bars = False
t0 = time.perf_counter()
ds = ray.data.read_json(files, override_num_blocks=max(len(files), 2 * workers))
ds.map(transform).write_json(out)
fsync_outputs(out)
print(json.dumps({"seconds": time.perf_counter() - t0, "init_s": t0 - t_init}))
''',
}


def _subprocess_json(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
                     ) -> tuple[dict[str, Any] | None, float, str]:
    t0 = time.perf_counter()
    # A session of its own: Ray's process reaper ends with os.killpg(0, SIGKILL), which
    # took this benchmark (and its shell) down with it when they shared a group.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # The whole session: Ray's or Beam's workers must not load the next side's tries.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None, time.perf_counter() - t0, f"timed out after {timeout:.0f}s"
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        err = stderr.strip()
        if "ModuleNotFoundError" in err or "ImportError" in err:
            return None, wall, "not installed"
        return None, wall, f"failed: {err.splitlines()[-1] if err else proc.returncode}"
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    return (json.loads(lines[-1]) if lines else {}), wall, ""


class Bench:
    def __init__(self, work: Path, files: list[Path], every_s: float, peer_python: str,
                 peer_timeout: float) -> None:
        self.work, self.files, self.every_s = work, files, every_s
        self.peer_python, self.peer_timeout = peer_python, peer_timeout
        self.n_run = 0

    def _out(self, name: str) -> Path:
        self.n_run += 1
        return self.work / "out" / f"{self.n_run:04d}-{name}"


    def _plain_loop(self, files: list[Path], out: Path) -> tuple[dict[str, Any], float]:
        got, wall, err = _subprocess_json(
            [sys.executable, "-c", TRANSFORM_SRC + PLAIN, ",".join(map(str, files)), str(out),
             str(self.every_s)], timeout=3600)
        if got is None:
            raise RuntimeError(f"plain loop {err}")
        return got, wall

    def plain(self) -> tuple[dict[str, Any] | None, Path]:
        out = self._out("plain")
        out.parent.mkdir(parents=True, exist_ok=True)
        got, wall = self._plain_loop(self.files, out)
        return {"work_s": got["seconds"], "wall_s": wall}, out

    def plain_2p(self) -> tuple[dict[str, Any] | None, Path]:
        """The machine's own ceiling for two workers: two plain loops at once, each on half
        the files, from the first one's start of its pipeline to the last one's fsynced end
        (the few ms between their starts count against them, as a sub-worker's start-up
        counts against segue)."""
        from concurrent.futures import ThreadPoolExecutor

        out = self._out("plain2p")
        out.parent.mkdir(parents=True, exist_ok=True)
        half = (len(self.files) + 1) // 2
        parts = (self.files[:half], self.files[half:])
        with ThreadPoolExecutor(2) as pool:
            done = list(pool.map(lambda i: self._plain_loop(parts[i], Path(f"{out}-{i}")), range(2)))
        got = [g for g, _ in done]
        return {"work_s": max(g["t1"] for g in got) - min(g["t0"] for g in got),
                "wall_s": max(w for _, w in done)}, out

    def segue(self, workers: int) -> tuple[dict[str, Any] | None, Path]:
        from segue.home import Home

        out = self._out(f"segue{workers}")
        home = self.work / f"home-{self.n_run}"
        run_id = f"bench-{self.n_run}"
        env = {**os.environ, "SEGUE_BENCH_WORKERS": str(workers)}
        got, wall, err = _subprocess_json(
            [sys.executable, "-m", "segue", "--home", str(home), "run", str(FLOW), "--run-id", run_id,
             "-p", f"input={self.files[0].parent}", "-p", f"out={out}"], timeout=3600, env=env)
        if got is None:
            raise RuntimeError(f"segue run (workers={workers}) {err}")
        task = Home.resolve(home).open_store().get_task(run_id, STEP)
        if task.started_at is None or task.finished_at is None:
            raise RuntimeError(f"segue run {run_id}: task has no start/finish time")
        return {"work_s": task.finished_at - task.started_at, "wall_s": wall}, out

    def inprocess(self) -> tuple[dict[str, Any] | None, Path]:
        out = self._out("inprocess")
        code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
                "from benchmarks.pipeline import inprocess_main; inprocess_main()")
        got, wall, err = _subprocess_json(
            [sys.executable, "-c", code, str(self.files[0].parent), str(out),
             str(self.work / f"inproc-{self.n_run}")], timeout=3600)
        if got is None:
            raise RuntimeError(f"in-process run_map {err}")
        return {"work_s": got["seconds"], "wall_s": wall}, out

    def peer(self, name: str, workers: int, runner: str = "direct",
             ) -> tuple[dict[str, Any] | None, Path | str]:
        out = self._out(f"{name}{workers}{runner}")
        out.parent.mkdir(parents=True, exist_ok=True)
        code = "import os\n" + TRANSFORM_SRC + _FSYNC_OUT + textwrap.dedent(PEERS[name])
        args = [self.peer_python, "-c", code, ",".join(map(str, self.files)), str(out),
                str(workers)] + ([runner] if name == "beam" else [])
        got, wall, err = _subprocess_json(args, timeout=self.peer_timeout)
        if got is None:
            return None, err
        res = {"work_s": got["seconds"], "wall_s": wall}
        if "init_s" in got:
            res["init_s"] = got["init_s"]
        return res, out


# -- the in-process shortcut (kept, labelled) ---------------------------------------
class BenchContext:
    """The StepContext API in one process: real, fsynced checkpoints; no store, no controller."""

    def __init__(self, root: Path, every_s: float = 1.0) -> None:
        from segue import checkpoint as ckpt

        self.ckpt = ckpt
        self.storage = ckpt.LocalStorage(root / "ckpt")
        self.run_id, self.step, self.epoch, self.attempt = "bench", "map", 1, 1
        self.params: dict[str, Any] = {}
        self.every_s = every_s
        self.last = time.monotonic()
        self.seq = 0

    def restore(self) -> Any:
        return None

    def checkpoint_due(self, steps: int | None = None) -> bool:
        return time.monotonic() - self.last >= self.every_s

    def progress(self, done: float, total: float | None = None) -> None:
        pass

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        self.seq += 1  # saved synchronously: durable whether or not the driver asked
        self.ckpt.save(self.storage, f"{self.seq:08d}", {"state": state}, meta={"position": position})
        self.last = time.monotonic()


def inprocess_main() -> None:
    from segue.data import JsonlSink, JsonlSource, run_map

    inp, out, work = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    os.environ["SEGUE_HOME"] = str(work / "home")
    ctx = BenchContext(work)
    t0 = time.perf_counter()
    run_map(ctx, JsonlSource(inp), transform, JsonlSink(out))
    print(json.dumps({"seconds": time.perf_counter() - t0}))


# -- resume at 90% through the CLI -------------------------------------------------
def resume_at_90(n: int, work: Path, files: int) -> dict[str, Any]:
    from segue.home import Home
    from segue.states import RunState

    work.mkdir(parents=True, exist_ok=True)
    inputs = make_input(work / "in", n, files)
    expected = digest_of_transform(inputs)
    home, probe, out, run_id = work / "home", work / "probe", work / "out", "resume90"
    probe.mkdir()
    hold_at = int(n * 0.9)
    cli = [sys.executable, "-m", "segue", "--home", str(home)]
    env = {**os.environ, "SEGUE_BENCH_WORKERS": "1"}
    run = subprocess.Popen(
        cli + ["run", str(FLOW), "--run-id", run_id, "-p", f"input={work / 'in'}", "-p", f"out={out}",
               "-p", f"probe={probe}", "-p", f"hold_at={hold_at}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        pb.wait_until(lambda: (probe / "held").exists() or run.poll() is not None, timeout=3600)
        if run.poll() is not None:
            store = Home.resolve(home).open_store()
            why = "; ".join(f"{e.kind} {e.to_state or ''} {e.reason}"
                            for e in store.list_events(run_id)[-4:])
            assert run.stderr is not None  # stderr=PIPE
            raise RuntimeError(f"segue run ended ({store.get_run(run_id).state}) before record "
                               f"{hold_at}: {why} {run.stderr.read().strip()[-300:]}")
        subprocess.run(cli + ["pause", run_id, "--wait"], check=True, capture_output=True,
                       timeout=600, env=env)
        run.wait(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    store = Home.resolve(home).open_store()
    if store.get_run(run_id).state != RunState.PAUSED:
        raise RuntimeError(f"run {run_id} is {store.get_run(run_id).state}, not PAUSED")
    paused_at = max((c for c in store.list_checkpoints(run_id, STEP) if c.status == "committed"),
                    key=lambda c: c.seq)
    t0 = time.time()
    res = subprocess.run(cli + ["resume", run_id], capture_output=True, text=True, timeout=3600,
                         env=env)
    total = time.time() - t0
    if res.returncode:
        raise RuntimeError(f"segue resume failed: {res.stderr.strip()[-500:]}")
    firsts = sorted((json.loads(p.read_text()) for p in probe.glob("first-*")),
                    key=lambda x: x["t"])
    after = [f for f in firsts if f["t"] >= t0]
    if not after:
        raise RuntimeError("the resumed run transformed no record")
    if wrong := mismatch(digest(_output_files(out)), expected):
        raise RuntimeError(f"resumed output: {wrong}")
    for p in inputs:
        p.unlink()
    return {"resume_s": after[0]["t"] - t0, "resume_total_s": total, "rss_mb": after[0]["rss_mb"],
            "paused_at_records": (paused_at.position or {}).get("records_in"),
            "output_verified": True}


def resume_tries(n: int, work: Path, files: int, tries: int) -> dict[str, Any]:
    """``tries`` runs paused at 90% and resumed (as many as every side of the throughput
    figures gets); the median of each figure, and every try's in ``tries``."""
    got = [resume_at_90(n, work / f"try-{i}", files) for i in range(tries)]
    med = {k: statistics.median(g[k] for g in got) for k in ("resume_s", "resume_total_s", "rss_mb")}
    return {**got[0], **med, "tries": [round(g["resume_s"], 4) for g in got]}


def mismatch(got: tuple[int, str], expected: tuple[int, str]) -> str | None:
    """Why output of digest ``got`` is not the ``expected`` one, or None when it is.

    An expectation of no record never matches: two empty outputs agree, but a
    benchmark that compared nothing proved nothing (an empty input, a side that
    wrote elsewhere), so it must not print a ratio.
    """
    if expected[0] == 0:
        return "the expected output has no record, so nothing would be compared"
    if got != expected:
        return f"wrote {got[0]} records with hash {got[1]}; expected {expected[0]} with {expected[1]}"
    return None


def digest_of_transform(inputs: list[Path]) -> tuple[int, str]:
    """The expected (records, hash): the transform applied to every input record."""
    n, acc = 0, 0
    for path in inputs:
        with open(path, "rb") as f:
            for line in f:
                canon = json.dumps(transform(json.loads(line)), sort_keys=True,
                                   separators=(",", ":")).encode()
                acc = (acc + int.from_bytes(hashlib.blake2b(canon, digest_size=8).digest(),
                                            "little")) % (1 << 64)
                n += 1
    return n, f"{acc:016x}"


# -- main ----------------------------------------------------------------------------
Runner = Callable[[], tuple[dict[str, Any] | None, Any]]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pipeline")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="200k records, 2 tries (said so)")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny sizes, one try, no peers: checks the benchmark runs (CI)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line at the end")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--files", type=int, default=4, help="input files (parallel reads for the peers)")
    ap.add_argument("--reps", type=int, default=None, help="tries per side (default 3; quick 2)")
    ap.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON", sys.executable))
    ap.add_argument("--peer-timeout", type=float, default=900)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--resume-sizes", default=None, help="comma-separated record counts")
    a = ap.parse_args(argv)
    resume_sizes: tuple[int, ...]
    if a.smoke:
        n, reps, resume_sizes = a.records or 3000, a.reps or 1, (3000,)
    elif a.quick:
        n, reps, resume_sizes = a.records or 200_000, a.reps or 2, (200_000, 1_000_000)
    else:
        n, reps, resume_sizes = a.records or 1_000_000, a.reps or 3, (1_000_000, 10_000_000)
    if a.resume_sizes:
        resume_sizes = tuple(int(x) for x in a.resume_sizes.split(","))
    say = (lambda *x: None) if a.json else (lambda *x: print(*x, file=sys.stderr, flush=True))
    notes = pb.byte_compile_segue()
    with tempfile.TemporaryDirectory(prefix="segue-bench-") as tmp:
        work = Path(tmp)
        pb.private_pool(work)  # never wait behind (or hold) other runs of this machine
        files = make_input(work / "in", n, a.files)
        expected = digest_of_transform(files)
        bench = Bench(work, files, 1.0, a.peer_python, a.peer_timeout)
        sides: dict[str, Runner] = {
            "plain": bench.plain,
            **({"plain_2p": bench.plain_2p} if len(files) > 1 else {}),
            "segue_1w": lambda: bench.segue(1),
            "segue_2w": lambda: bench.segue(2),
            "inprocess": bench.inprocess,
        }
        if not (a.smoke or a.no_peers):
            sides.update({
                "beam_1w": lambda: bench.peer("beam", 1),
                "beam_2w": lambda: bench.peer("beam", 2),
                "ray_1w": lambda: bench.peer("ray", 1),
                "ray_2w": lambda: bench.peer("ray", 2),
            })
            prism, why = bench.peer("beam", 2, "prism")
            if prism is None:
                notes.append(f"beam prism runner: {why}; its DirectRunner is measured instead")
            else:
                sides["beam_prism"] = lambda: bench.peer("beam", 2, "prism")
        elif a.smoke:
            notes.append("--smoke: peers not run")
        runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
        skipped: dict[str, str] = {}
        for rep in range(reps):  # interleaved: every side once per round
            for name, fn in sides.items():
                if name in skipped:
                    continue
                res, out = fn()
                if res is None:
                    skipped[name] = str(out)
                    notes.append(f"{name}: {out} in {a.peer_python}; skipped "
                                 f"(see benchmarks/requirements.txt)")
                    continue
                if wrong := mismatch(digest(_output_files(Path(out))), expected):
                    raise SystemExit(f"{name} (try {rep + 1}): {wrong}: no ratio")
                res["verified"] = True
                runs[name].append(res)
                say(f"{name} try {rep + 1}: {n / res['work_s']:,.0f} records/s "
                    f"(work {res['work_s']:.2f}s, wall {res['wall_s']:.2f}s)")
                _rmtree(Path(out))
        for p in files:
            p.unlink()
        resume = {}
        for size in resume_sizes:
            resume[size] = resume_tries(size, work / f"resume-{size}", a.files, reps)
            say(f"resume at 90% of {size:,}: {resume[size]}")
    summary = summarize(n, reps, runs, resume, resume_sizes, expected, notes, a)
    print(json.dumps(summary))


def _rmtree(p: Path) -> None:
    import shutil

    if p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    for q in p.parent.glob(p.name + "*"):
        if q.is_file():
            q.unlink()
        elif q.is_dir():
            shutil.rmtree(q, ignore_errors=True)


GOALS = {  # key: (comparison, target)
    "vs_plain_loop": (">=", 0.9),
    "scale_2_workers": (">=", 1.7),
    "vs_beam": (">=", 3.0),
    "vs_ray_data": (">=", 1.3),
    "resume_at_90pct_s": ("<=", 1.0),
}


def summarize(n: int, reps: int, runs: dict[str, list[dict[str, Any]]], resume: dict[int, Any],
              resume_sizes: tuple[int, ...], expected: tuple[int, str], notes: list[str],
              a: argparse.Namespace) -> dict[str, Any]:
    def rate(name: str, key: str = "work_s") -> float | None:
        r = runs.get(name)
        return n / min(x[key] for x in r) if r else None

    def best(names: list[str], key: str = "work_s") -> tuple[str | None, float | None]:
        rates = [(nm, rate(nm, key)) for nm in names]
        got = [(nm, q) for nm, q in rates if q]
        return max(got, key=lambda x: x[1]) if got else (None, None)

    def rounded(x: float | None) -> int | None:
        return round(x) if x else None

    def over(x: float | None, y: float | None) -> float | None:
        return x / y if x and y else None

    def ratio(x: float | None, y: float | None) -> float | None:
        q = over(x, y)
        return None if q is None else round(q, 3)

    seg_name, seg = best(["segue_1w", "segue_2w"])
    beam_name, beam = best(["beam_1w", "beam_2w", "beam_prism"])
    ray_name, ray = best(["ray_1w", "ray_2w"])
    big = resume[resume_sizes[-1]]
    out: dict[str, Any] = {
        "records": n, "tries_per_side": reps, "input_files": a.files,
        "output_verified": {"records": expected[0], "hash": expected[1],
                            "every_run_matched": all(x["verified"] for r in runs.values() for x in r)},
        "records_per_s": round(seg) if seg else None,
        "records_per_s_config": seg_name,
        **{f"{k}_records_per_s": rounded(rate(k)) for k in runs},
        "plain_loop_records_per_s": rounded(rate("plain")),
        "beam_records_per_s": round(beam) if beam else None, "beam_config": beam_name,
        "ray_data_records_per_s": round(ray) if ray else None, "ray_data_config": ray_name,
        "vs_plain_loop": ratio(rate("segue_1w"), rate("plain")),
        "scale_2_workers": ratio(rate("segue_2w"), rate("segue_1w")),
        # The ceiling of that ratio on this machine, measured in the same run: two plain
        # loops at once against one; and how close segue's two workers come to it.
        "plain_2p_vs_plain": ratio(rate("plain_2p"), rate("plain")),
        "scale_2_workers_vs_machine": ratio(over(rate("segue_2w"), rate("segue_1w")),
                                            over(rate("plain_2p"), rate("plain"))),
        "vs_beam": ratio(seg, beam),
        "vs_ray_data": ratio(seg, ray),
        "vs_plain_loop_wall": ratio(rate("segue_1w", "wall_s"), rate("plain", "wall_s")),
        "inprocess_vs_plain_loop": ratio(rate("inprocess"), rate("plain")),
        "resume_at_90pct_s": round(big["resume_s"], 4),
        "resume_total_s": round(big["resume_total_s"], 3),
        "resume_input_records": resume_sizes[-1],
        "resume_paused_at_records": big["paused_at_records"],
        "resume_rss_mb": round(big["rss_mb"], 1),
        "resume_s_by_size": {str(k): round(v["resume_s"], 4) for k, v in resume.items()},
        "resume_s_tries": big["tries"],
        "resume_rss_mb_by_size": {str(k): round(v["rss_mb"], 1) for k, v in resume.items()},
        "runs": {k: [{kk: round(vv, 4) if isinstance(vv, float) else vv for kk, vv in x.items()}
                     for x in v] for k, v in runs.items()},
        "cpus": os.cpu_count(),
        "notes": notes + [
            "work_s: segue from task start to success in the store (worker start included, CLI "
            "and controller start-up not); others from before the pipeline to fsynced output "
            "(imports and ray.init not included); best of the tries",
            f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus",
        ],
    }
    if a.smoke:
        out["notes"].append(f"--smoke: {n} records, resume at 90% of {resume_sizes[-1]}; "
                            "figures mean nothing, the run checks the benchmark works")
    elif a.quick:
        out["notes"].append(f"--quick: {n} records; resume measured at 90% of "
                            f"{', '.join(f'{s:,}' for s in resume_sizes)} records")
    out["goals"] = pb.goals(out, GOALS)
    return out


if __name__ == "__main__":
    main()
