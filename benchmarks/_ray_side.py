"""The Ray figures of benchmarks.scale, measured on a local Ray cluster (run as a child process).

    python -m benchmarks._ray_side --records N --tries T --work DIR [--node-cpus 2] [--stall 60]

benchmarks.scale runs this in a session of its own: a process that starts a Ray
head leads its process group and Ray's reaper ends that group when it exits, and
a timeout (SIGTERM, then SIGKILL to the session) ends all of it at once; on
SIGTERM the cluster is shut down and every `segue run` it started is killed.

One cluster (``ray.cluster_utils.Cluster``): a head with no CPUs (nothing runs
there) and one worker node of ``--node-cpus`` logical CPUs (3: a data step's
worker holds one, each sub-worker one; logical CPUs gate placement only, every
side runs on the same physical cores); a second such
node joins for 4 workers and the node loss. Node health checks every
``--health-period-ms`` (200), a node declared dead after ``--health-failures``
(3) missed ones.

* Throughput: ``segue run benchmarks/flows/ray_map_flow.py`` (JSONL -> the
  transform of benchmarks.pipeline -> exactly-once JSONL sink; ``workers`` from
  $BENCH_WORKERS, named in $SEGUE_RAY_ENV) with 1 and 2 workers on the one
  node, then 4 workers on the two, each on local processes (default executor)
  and with ``--executor ray``; the cluster is up during both, so both sides run
  beside the same idle Ray daemons. ``work_s``: the task's start to its success
  in the store (for Ray, placing and starting its actors included; CLI and
  controller start-up not). Ray Data runs on the same cluster with 2 CPUs
  (resource_limits), the same records and transform, one read block per file
  (override_num_blocks), output fsynced, timed from before the pipeline to the
  fsynced output (imports and ray.init not included), as benchmarks.pipeline
  times it. Rounds interleave the sides of a phase; every side gets ``--tries``.
  A Ray side whose run fails, or shows no progress (state, progress, a
  checkpoint) for ``--stall`` seconds (Ray never placed what it asked for), is
  killed and reported null with its reason.
* Node loss: ``segue run benchmarks/flows/ray_loss_flow.py --executor ray``;
  once its first attempt committed a checkpoint, the node its log names is
  removed at once (``allow_graceful=False``: its raylet and every process on it
  die), and the time runs until the second attempt committed its first
  checkpoint (the store's commit time). A fresh node replaces the lost one
  before the next try.

Every output is checked (record count and order-independent hash, as
benchmarks.pipeline's digest; the counter's exact sum) before any figure is
printed; a mismatch exits with code 3 and says so. The last line printed is one
JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _probe as pb
from . import pipeline as pl

FLOWS = Path(__file__).parent / "flows"
MAP_FLOW = FLOWS / "ray_map_flow.py"
LOSS_FLOW = FLOWS / "ray_loss_flow.py"
MAP_STEP, LOSS_STEP = "records", "count"
MiB = 2**20
NODE = {"num_cpus": 3, "object_store_memory": 256 * MiB}
WORKER_COUNTS = (1, 2, 4)
MISMATCH = 3  # the exit code of a run whose output is wrong

RAY_DATA = '''
import json, os, sys, time
files, out, workers, address = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4]
t_init = time.perf_counter()
import ray
ray.init(address=address, log_to_driver=False)
import ray.data
ctx = ray.data.DataContext.get_current()
ctx.enable_progress_bars = False
# As many CPUs as segue's workers get, however large the cluster.
ctx.execution_options.resource_limits = ray.data.ExecutionResources(cpu=workers)
t0 = time.perf_counter()
ds = ray.data.read_json(files, override_num_blocks=max(len(files), 2 * workers))
ds.map(transform).write_json(out)
fsync_outputs(out)
print(json.dumps({"seconds": time.perf_counter() - t0, "init_s": t0 - t_init}))
'''


class Mismatch(Exception):
    """An output differs from the expected one: no figure may be printed."""


class Stalled(Exception):
    """A run made no progress for a while (its one line says what it waited on)."""


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """``cmd`` in a session of its own; on timeout the whole session is killed."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _tail(text: str, n: int = 1500) -> str:
    return text.strip()[-n:]


class SegueRun:
    """``segue run`` (the CLI, its controller, its workers) in a session of its own, its
    output in files; whatever happens, :meth:`end` leaves no process of it behind."""

    def __init__(self, cmd: list[str], env: dict[str, str], logs: Path) -> None:
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / "stdout", "w") as out, open(logs / "stderr", "w") as err:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def output(self) -> str:
        return "\n".join(_tail((self.logs / f).read_text(errors="replace")) for f in ("stdout", "stderr"))

    def end(self) -> None:
        if self.proc.poll() is None:  # its controller's Ray actors die with their owner
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


class RaySide:
    def __init__(self, work: Path, records: int, files: int, tries: int, timeout: float,
                 node_cpus: int, stall_s: float, health: tuple[int, int]) -> None:
        self.work, self.records, self.n_files, self.tries, self.timeout = work, records, files, tries, timeout
        self.node = {**NODE, "num_cpus": node_cpus}
        self.stall_s = stall_s
        self.health = health  # period (ms), failures
        self.n = 0
        self.cluster: Any = None
        self.inputs: list[Path] = []
        self.expected: tuple[int, str] = (0, "")

    # -- the cluster ------------------------------------------------------------------
    def start_cluster(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": 128 * MiB, "include_dashboard": False,
            "_system_config": {"health_check_period_ms": self.health[0],
                               "health_check_failure_threshold": self.health[1],
                               "health_check_initial_delay_ms": 0}})
        self.add_node()

    def add_node(self) -> None:
        self.cluster.add_node(**self.node)
        self.cluster.wait_for_nodes()

    def stop_cluster(self) -> None:
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.shutdown()
            self.cluster = None

    def _segue(self, home: Path, *args: str) -> list[str]:
        return [sys.executable, "-m", "segue", "--home", str(home), *args]

    def _env(self, **extra: str) -> dict[str, str]:
        # The flow's own variable reaches a Ray node only when $SEGUE_RAY_ENV names it.
        return {**os.environ, "SEGUE_RAY_ENV": "BENCH_WORKERS", **extra}

    def _on_ray(self) -> list[str]:
        return ["--executor", "ray", "--ray-address", self.cluster.address]

    def _watch(self, run: SegueRun, home: Path, run_id: str, step: str) -> None:
        """Wait for ``run`` to end; raise Stalled if its step shows no sign of progress
        (state, progress, a checkpoint) for stall_s, TimeoutError past the timeout."""
        from segue.home import Home

        t0 = last_change = time.monotonic()
        seen: Any = None
        store = None
        try:
            while run.proc.poll() is None:
                time.sleep(0.25)
                now = time.monotonic()
                if now - t0 > self.timeout:
                    raise TimeoutError(f"{run_id} did not end within {self.timeout:.0f}s")
                if store is None and (home / "segue.db").exists():
                    store = Home.resolve(home).open_store()
                if store is None:
                    continue
                with contextlib.suppress(Exception):  # the run may not have its task yet
                    t = store.get_task(run_id, step)
                    ck = store.list_checkpoints(run_id, step)
                    sig = (t.state, t.epoch, t.progress_done, ck[0].seq if ck else None)
                    if sig != seen:
                        seen, last_change = sig, now
                if now - last_change > self.stall_s:
                    logs = sorted((home / "logs" / run_id).glob(f"{step}.e*.log"))
                    said = _tail(logs[-1].read_text(errors="replace"), 600) if logs else ""
                    raise Stalled(f"no progress for {self.stall_s:.0f}s (task {seen[0] if seen else '?'}, "
                                  f"progress {seen[2] if seen else '?'}); Ray never placed all it asked "
                                  f"for? attempt log: {said!r}")
        finally:
            if store is not None:
                store.close()

    # -- throughput -------------------------------------------------------------------
    def map_run(self, workers: int, ray: bool) -> dict[str, float]:
        from segue.home import Home

        self.n += 1
        label = f"{'ray' if ray else 'local'}{workers}"
        home, run_id = self.work / f"home-{self.n}", f"map{self.n}"
        out = self.work / "out" / f"{self.n:03d}-{label}"
        t0 = time.perf_counter()
        run = SegueRun(self._segue(home, "run", str(MAP_FLOW), "--run-id", run_id,
                                   "-p", f"input={self.inputs[0].parent}", "-p", f"out={out}",
                                   *(self._on_ray() if ray else [])),
                       self._env(BENCH_WORKERS=str(workers)), self.work / "cli" / f"{self.n:03d}-{label}")
        try:
            self._watch(run, home, run_id, MAP_STEP)
        finally:
            run.end()
        wall = time.perf_counter() - t0
        if run.proc.returncode != 0:
            raise RuntimeError(f"segue run ({label}) exited {run.proc.returncode}:\n{run.output()}")
        store = Home.resolve(home).open_store()
        try:
            task = store.get_task(run_id, MAP_STEP)
        finally:
            store.close()
        if task.started_at is None or task.finished_at is None:
            raise RuntimeError(f"segue run ({label}): the task has no start or finish time")
        self._check(label, out)
        shutil.rmtree(home, ignore_errors=True)
        return {"work_s": task.finished_at - task.started_at, "wall_s": wall}

    def ray_data(self, workers: int) -> dict[str, float] | str:
        self.n += 1
        out = self.work / "out" / f"{self.n:03d}-raydata{workers}"
        out.parent.mkdir(parents=True, exist_ok=True)
        code = "import os\n" + pl.TRANSFORM_SRC + pl._FSYNC_OUT + RAY_DATA
        t0 = time.perf_counter()
        try:
            proc = _run([sys.executable, "-c", code, ",".join(map(str, self.inputs)), str(out), str(workers),
                         self.cluster.address], dict(os.environ), self.timeout)
        except subprocess.TimeoutExpired:
            return f"Ray Data timed out after {self.timeout:.0f}s"
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else str(proc.returncode)
            if "ModuleNotFoundError" in proc.stderr or "ImportError" in proc.stderr:
                return f"ray.data cannot be imported ({last}); pip install 'ray[data]'"
            return f"Ray Data failed: {last}"
        got = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
        self._check(f"raydata{workers}", out)
        return {"work_s": got["seconds"], "wall_s": wall, "init_s": got["init_s"]}

    def _check(self, label: str, out: Path) -> None:
        if why := pl.mismatch(pl.digest(pl._output_files(out)), self.expected):
            raise Mismatch(f"{label}: {why}: no ratio is printed")
        if out.is_dir():
            shutil.rmtree(out, ignore_errors=True)
        for p in out.parent.glob(out.name + "*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()

    def throughput(self) -> dict[str, Any]:
        """1 and 2 workers and Ray Data on one worker node; then a second node joins and
        4 workers run (twice the CPUs: room for a sub-worker per CPU however segue places
        them). Every side of a phase runs once per round; a Ray side that fails or stalls
        is skipped from then on, with its reason."""
        self.inputs = pl.make_input(self.work / "in", self.records, self.n_files)
        self.expected = pl.digest_of_transform(self.inputs)
        runs: dict[str, list[dict[str, float]]] = {f"{s}_{w}w": [] for w in WORKER_COUNTS
                                                   for s in ("local", "ray")}
        runs["ray_data_2w"] = []
        skipped: dict[str, str] = {}

        def on_ray(w: int) -> None:
            name = f"ray_{w}w"
            if name in skipped:
                return
            try:
                runs[name].append(self.map_run(w, ray=True))
            except (Stalled, RuntimeError, TimeoutError) as exc:
                skipped[name] = f"segue on Ray, workers={w}: {exc}"

        for _ in range(self.tries):
            for w in (1, 2):
                runs[f"local_{w}w"].append(self.map_run(w, ray=False))
                on_ray(w)
            if "ray_data_2w" not in skipped:
                got = self.ray_data(2)
                if isinstance(got, str):
                    skipped["ray_data_2w"] = got
                else:
                    runs["ray_data_2w"].append(got)
        self.add_node()
        for _ in range(self.tries):
            runs["local_4w"].append(self.map_run(4, ray=False))
            on_ray(4)
        return {"runs": runs, "skipped": skipped, "expected": self.expected}

    # -- node loss --------------------------------------------------------------------
    def node_loss(self, i: int) -> dict[str, Any]:
        """One try: lose the node of the step's first attempt once it committed."""
        from segue.home import Home
        from segue.store import Store

        home, run_id, gate = self.work / f"loss-home-{i}", f"loss{i}", self.work / f"gate-{i}"
        n = 400
        run = SegueRun(self._segue(home, "run", str(LOSS_FLOW), "--run-id", run_id, "-p", f"n={n}",
                                   "-p", f"hold={gate}", *self._on_ray()),
                       self._env(), self.work / "cli" / f"loss-{i}")
        store: Store | None = None
        try:
            def committed(epoch: int) -> Any:
                assert store is not None  # opened before the first call
                got = [c for c in store.list_checkpoints(run_id, LOSS_STEP) if c.epoch == epoch]
                return min(got, key=lambda c: c.seq) if got else None

            def log_node(epoch: int) -> str | None:
                log = home / "logs" / run_id / f"{LOSS_STEP}.e{epoch}.log"
                with contextlib.suppress(OSError):
                    m = re.search(r"on Ray node ([0-9a-f]+)", log.read_text())
                    return m.group(1) if m else None
                return None

            def has_store() -> bool:
                if run.proc.poll() is not None:
                    raise RuntimeError(f"segue run (node loss) exited {run.proc.returncode}:\n{run.output()}")
                return (home / "segue.db").exists()

            pb.wait_until(has_store, 120, 0.05, "the node-loss run's store")
            store = Home.resolve(home).open_store()
            pb.wait_until(lambda: committed(1), self.stall_s, 0.01, "a checkpoint of the first attempt")
            lost = pb.wait_until(lambda: log_node(1), 60, 0.02, "the first attempt's log to name its node")
            victim = next((nd for nd in self.cluster.worker_nodes if nd.node_id == lost), None)
            if victim is None:
                raise RuntimeError(f"the first attempt ran on Ray node {lost}, not on a worker node")
            t_loss = time.time()
            self.cluster.remove_node(victim, allow_graceful=False)
            first = pb.wait_until(lambda: committed(2), self.stall_s, 0.01,
                                  "a checkpoint of the second attempt")
            moved_to = pb.wait_until(lambda: log_node(2), 60, 0.02, "the second attempt's log to name its node")
            if moved_to == lost:
                raise RuntimeError("the second attempt ran on the lost node")
            events = store.list_events(run_id, kinds=("task",))
            died = next((e.time for e in events if "the Ray actor of this attempt died" in e.reason), None)
            restarted = next((e.time for e in events if e.to_state == "RUNNING" and e.time > t_loss), None)
            gate.touch()
            self._watch(run, home, run_id, LOSS_STEP)
            if run.proc.returncode != 0:
                raise RuntimeError(f"segue run (node loss) exited {run.proc.returncode}:\n{run.output()}")
            value = json.loads(_run(self._segue(home, "output", run_id, LOSS_STEP, "--json"), self._env(),
                                    120).stdout)
            want = {"i": n, "acc": sum(k * k for k in range(n))}
            if {k: value.get(k) for k in want} != want:
                raise Mismatch(f"node loss try {i + 1}: the counter returned {value}, expected {want}: "
                               "an iteration was lost or repeated; no figure is printed")
            attempts = store.get_task(run_id, LOSS_STEP).attempts
        finally:
            if store is not None:
                store.close()
            run.end()
        self.add_node()  # two worker nodes again for the next try
        return {"recovery_s": first.created_at - t_loss,
                "segue_saw_actor_die_s": (died - t_loss) if died else None,
                "next_attempt_started_s": (restarted - t_loss) if restarted else None,
                "attempts": attempts}


def summarize(side: RaySide, thr: dict[str, Any], loss: list[dict[str, Any]] | str) -> dict[str, Any]:
    runs, skipped = thr["runs"], thr["skipped"]

    def best(name: str) -> float | None:
        return min(r["work_s"] for r in runs[name]) if runs.get(name) else None

    def ratio(x: float | None, y: float | None) -> float | None:
        return round(x / y, 3) if x and y else None

    def r4(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    local2, ray2, data2 = best("local_2w"), best("ray_2w"), best("ray_data_2w")
    period, failures = side.health
    detection = period * failures / 1000
    cpus = side.node["num_cpus"]
    out: dict[str, Any] = {
        "efficiency_2_workers": ratio(local2, ray2),
        "vs_ray_data": ratio(data2, ray2),
        "node_loss_recovery_s": None if isinstance(loss, str)
        else round(statistics.median(x["recovery_s"] for x in loss), 3),
        "ray_node_death_detection_s": detection,
        "node_loss_recovery_goal_s": round(detection + 2.0, 3),
        "ray_workers_s": {str(w): r4(best(f"ray_{w}w")) for w in WORKER_COUNTS},
        "local_workers_s": {str(w): r4(best(f"local_{w}w")) for w in WORKER_COUNTS},
        "ray_data_2w_s": r4(data2),
        "ray_cluster": f"ray.cluster_utils.Cluster on this machine ({os.cpu_count()} cores): a head with "
                       f"num_cpus=0 and one worker node with num_cpus={cpus} for 1 and 2 workers and Ray "
                       f"Data (resource_limits cpu=2, same cluster); a second num_cpus={cpus} node joins "
                       f"for 4 workers and the node loss; health checks every {period} ms, "
                       f"{failures} missed = dead",
        "ray_records": side.records,
        "ray_tries_per_side": side.tries,
        "ray_output_verified": {"records": thr["expected"][0], "hash": thr["expected"][1],
                                "every_run_matched": True},
        "node_loss_tries": loss if isinstance(loss, str) else
        [{k: round(v, 3) if isinstance(v, float) else v for k, v in x.items()} for x in loss],
        "ray_runs": {k: [{kk: round(vv, 4) for kk, vv in x.items()} for x in v] for k, v in runs.items()},
    }
    why = dict(skipped)
    if isinstance(loss, str):
        why["node_loss_recovery_s"] = loss
    if why:
        out["ray_skipped"] = why
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks._ray_side")
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--tries", type=int, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--node-cpus", type=int, default=3, help="logical CPUs of each Ray worker node")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for any one run")
    ap.add_argument("--stall", type=float, default=60, help="seconds without progress that end a run")
    ap.add_argument("--health-period-ms", type=int, default=200, help="Ray's health_check_period_ms")
    ap.add_argument("--health-failures", type=int, default=3, help="Ray's health_check_failure_threshold")
    a = ap.parse_args(argv)
    # SIGTERM from benchmarks.scale (its timeout): leave through the finally below.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if inspect.getsource(pl.transform) != _flow_transform_source():
        raise SystemExit("benchmarks/flows/ray_map_flow.py's transform differs from pipeline_flow.py's")
    a.work.mkdir(parents=True, exist_ok=True)
    pb.private_pool(a.work)  # never wait behind (or hold) other runs of this machine
    side = RaySide(a.work, a.records, a.files, a.tries, a.timeout, a.node_cpus, a.stall,
                   (a.health_period_ms, a.health_failures))
    loss: list[dict[str, Any]] | str
    try:
        side.start_cluster()
        thr = side.throughput()  # leaves two worker nodes: a lost step moves to the other
        try:
            loss = [side.node_loss(i) for i in range(a.tries)]
        except (RuntimeError, TimeoutError, Stalled) as exc:
            loss = f"segue on Ray, node loss: {exc}"
    except Mismatch as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(MISMATCH)
    finally:
        side.stop_cluster()
    print(json.dumps(summarize(side, thr, loss)))


def _flow_transform_source() -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_bench_ray_map_flow", MAP_FLOW)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return inspect.getsource(mod.transform)


if __name__ == "__main__":
    main()
