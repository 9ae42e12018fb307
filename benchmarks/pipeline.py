"""Data-pipeline benchmark: JSON records -> transform -> JSONL, segue vs its peers.

    python -m benchmarks.pipeline --quick --json

Side by side on the same input file: a plain Python loop, segue's run_map
with the exactly-once JSONL sink (an in-process context that commits real
checkpoints through segue.checkpoint every second), Apache Beam (default
local runner) and Ray Data. Peers run in a subprocess of ``--peer-python``
(default: this interpreter) and are skipped with a note when not importable.
Then the resume test: run a step to 90% of an input, pause it, and time a
fresh process from restore() to its first processed record (no rescan: the
position is a byte offset), with its peak RSS, at two input sizes.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any


def transform(r: dict[str, Any]) -> dict[str, Any]:
    t = r["text"]
    return {"id": r["id"], "text": t.upper(), "len": len(t), "score": r["x"] * 2.0 + 1.0, "tag": r["tag"]}


TRANSFORM_SRC = "from typing import Any\n" + inspect.getsource(transform)  # the peers run the very same function


def make_input(path: Path, n: int) -> None:
    with open(path, "w") as f:
        buf = []
        for i in range(n):
            buf.append(json.dumps({"id": i, "text": f"record number {i} of the benchmark", "x": i * 0.5,
                                   "tag": "abcdefgh"[i % 8]}))
            if len(buf) == 10_000:
                f.write("\n".join(buf) + "\n")
                buf = []
        if buf:
            f.write("\n".join(buf) + "\n")


def plain_loop(inp: Path, out: Path) -> float:
    t0 = time.perf_counter()
    loads, dumps = json.loads, json.dumps
    with open(inp, "rb") as f, open(out, "w") as g:
        for line in f:
            g.write(dumps(transform(loads(line))) + "\n")
        g.flush()
        os.fsync(g.fileno())
    return time.perf_counter() - t0


class BenchContext:
    """The StepContext API in-process: checkpoints are real segue checkpoints (fsynced)."""

    def __init__(self, root: Path, every_s: float = 1.0, stop_at: int | None = None, epoch: int = 1) -> None:
        from segue import checkpoint as ckpt

        self.ckpt = ckpt
        self.storage = ckpt.LocalStorage(root / "ckpt")
        self.root = root
        self.run_id, self.step, self.epoch, self.attempt = "bench", "map", epoch, epoch
        self.params: dict[str, Any] = {}
        self.every_s, self.stop_at = every_s, stop_at
        self.last = time.monotonic()
        latest = root / "LATEST"
        self.seq = int(latest.read_text()) if latest.exists() else 0
        self.first_record_t: float | None = None

    def restore(self) -> Any:
        if self.seq == 0:
            return None
        return self.ckpt.load(self.storage, f"{self.seq:08d}").state["state"]

    def checkpoint_due(self, steps: int | None = None) -> bool:
        if self.first_record_t is None:
            self.first_record_t = time.perf_counter()
        if self.stop_at is not None and steps is not None and steps >= self.stop_at:
            return True
        return time.monotonic() - self.last >= self.every_s

    def progress(self, done: float, total: float | None = None) -> None:
        pass

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False) -> None:
        from segue.run.context import Park

        # Saved synchronously: durable whether or not the driver asked.
        self.seq += 1
        self.ckpt.save(self.storage, f"{self.seq:08d}", {"state": state}, meta={"position": position})
        (self.root / "LATEST").write_text(str(self.seq))  # the "store" row: written after the save
        self.last = time.monotonic()
        if self.stop_at is not None and state["stats"]["records_in"] >= self.stop_at:
            raise Park()


def segue_run(inp: Path, out: Path, work: Path) -> float:
    from segue.data import JsonlSink, JsonlSource, run_map

    os.environ.setdefault("SEGUE_HOME", str(work / "home"))
    ctx = BenchContext(work)
    t0 = time.perf_counter()
    run_map(ctx, JsonlSource(str(inp)), transform, JsonlSink(out))
    return time.perf_counter() - t0


PEERS = {
    "beam": '''
import apache_beam as beam, json, sys, time
inp, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
with beam.Pipeline() as p:
    (p | beam.io.ReadFromText(inp) | beam.Map(json.loads) | beam.Map(transform)
       | beam.Map(json.dumps) | beam.io.WriteToText(out))
print(json.dumps({"seconds": time.perf_counter() - t0}))
''',
    "ray_data": '''
import json, sys, time, ray
inp, out = sys.argv[1], sys.argv[2]
t_init = time.perf_counter()
ray.init(include_dashboard=False, log_to_driver=False)
import ray.data
t0 = time.perf_counter()
ray.data.read_json(inp).map(transform).write_json(out)
print(json.dumps({"seconds": time.perf_counter() - t0, "init_s": t0 - t_init}))
''',
}


def run_peer(name: str, python: str, inp: Path, out: Path, timeout: float) -> tuple[float | None, str]:
    code = TRANSFORM_SRC + textwrap.dedent(PEERS[name])
    try:
        proc = subprocess.run([python, "-c", code, str(inp), str(out)], capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{name}: timed out after {timeout:.0f}s"
    if proc.returncode != 0:
        if "ModuleNotFoundError" in proc.stderr or "ImportError" in proc.stderr:
            return None, f"{name}: not installed in {python}; skipped (see benchmarks/requirements.txt)"
        return None, f"{name}: failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"
    last = [line for line in proc.stdout.splitlines() if line.startswith("{")][-1]
    got = json.loads(last)
    note = f"{name}: {got['seconds']:.2f}s" + (f" (+{got['init_s']:.1f}s ray.init, not counted)" if "init_s" in got else "")
    return float(got["seconds"]), note


RESUME_CHILD = '''
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
t_start = time.perf_counter()
from benchmarks.pipeline import BenchContext, transform
from segue.data import JsonlSink, JsonlSource, run_map
work = Path(sys.argv[1])
ctx = BenchContext(work, epoch=2)
t0 = time.perf_counter()
run_map(ctx, JsonlSource(sys.argv[2]), transform, JsonlSink(work / "out"))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"resume_s": ctx.first_record_t - t0, "total_s": time.perf_counter() - t0,
                  "imports_s": t0 - t_start, "rss_mb": rss}))
'''


def resume_at_90(n: int, work: Path) -> dict[str, float]:
    from segue.data import JsonlSink, JsonlSource, run_map
    from segue.run.context import Park

    work.mkdir(parents=True, exist_ok=True)
    inp = work / "in.jsonl"
    make_input(inp, n)
    os.environ["SEGUE_HOME"] = str(work / "home")
    ctx = BenchContext(work, every_s=3600, stop_at=int(n * 0.9))
    try:
        run_map(ctx, JsonlSource(str(inp)), transform, JsonlSink(work / "out"))
        raise RuntimeError("the step did not pause at 90%")
    except Park:
        pass
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, "-c", RESUME_CHILD, str(work), str(inp), root],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    inp.unlink()
    return got


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.pipeline")
    ap.add_argument("--quick", action="store_true", help="smaller inputs (said so in the notes)")
    ap.add_argument("--json", action="store_true", help="print only the JSON summary line at the end")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--peer-python", default=os.environ.get("BENCH_PEER_PYTHON", sys.executable))
    ap.add_argument("--peer-timeout", type=float, default=900)
    a = ap.parse_args(argv)
    n = a.records or 1_000_000
    resume_sizes = (1_000_000, 2_000_000) if a.quick else (5_000_000, 10_000_000)
    notes: list[str] = []
    say = (lambda *x: None) if a.json else (lambda *x: print(*x, flush=True))
    with tempfile.TemporaryDirectory(prefix="segue-bench-") as tmp:
        work = Path(tmp)
        inp = work / "in.jsonl"
        make_input(inp, n)
        t_plain = plain_loop(inp, work / "plain.jsonl")
        say(f"plain loop: {n / t_plain:,.0f} records/s")
        t_segue = segue_run(inp, work / "segue-out", work / "segue")
        say(f"segue run_map: {n / t_segue:,.0f} records/s")
        peers: dict[str, float | None] = {}
        for name in ("beam", "ray_data"):
            secs, note = run_peer(name, a.peer_python, inp, work / f"{name}-out", a.peer_timeout)
            peers[name] = secs
            notes.append(note)
            say(note)
        inp.unlink()
        resume = {}
        for size in resume_sizes:
            resume[size] = resume_at_90(size, work / f"resume-{size}")
            say(f"resume at 90% of {size:,}: {resume[size]}")
    if a.quick:
        notes.append(f"--quick: resume measured at 90% of {resume_sizes[0]:,} and {resume_sizes[1]:,} "
                     f"records, not 10M")
    rs = n / t_segue
    big = resume[resume_sizes[-1]]
    summary = {
        "records": n,
        "records_per_s": round(rs),
        "plain_loop_records_per_s": round(n / t_plain),
        "beam_records_per_s": round(n / peers["beam"]) if peers["beam"] else None,
        "ray_data_records_per_s": round(n / peers["ray_data"]) if peers["ray_data"] else None,
        "vs_plain_loop": round(rs / (n / t_plain), 3),
        "vs_beam": round(rs / (n / peers["beam"]), 2) if peers["beam"] else None,
        "vs_ray_data": round(rs / (n / peers["ray_data"]), 2) if peers["ray_data"] else None,
        "resume_at_90pct_s": round(big["resume_s"], 4),
        "resume_input_records": resume_sizes[-1],
        "resume_rss_mb": round(big["rss_mb"], 1),
        "resume_rss_mb_by_size": {str(k): round(v["rss_mb"], 1) for k, v in resume.items()},
        "resume_s_by_size": {str(k): round(v["resume_s"], 4) for k, v in resume.items()},
        "notes": notes,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
