"""What a coordinated checkpoint of a gang costs, against one rank and torch.distributed.checkpoint;
and what segue's Ray executor costs and recovers, against local processes and Ray Data.

    python -m benchmarks.scale --quick --json
    python -m benchmarks.scale --smoke --json        # tiny sizes, one try each: checks it runs (CI)

Every side saves the same state K times (15; ``--smoke`` 2), through its real engine.
The state (benchmarks/flows/gang_state.py) is shaped as a model's: per rank, 64 MiB in
8 large float32 arrays and 1,000 small ones of 1 KiB (``--smoke``: 1 MiB, 2 and 10),
as a state dict holds a few large weights and many small ones. The same figures for
one 64 MiB tensor per rank, which only the disk bounds, are printed under
``one_tensor``. The sides:

- segue's gang step (`segue run`, world_size=2). Each checkpoint is two shards written
  by two rank processes, two votes, the gang manifest and the store record.
- One segue step writing both ranks' arrays in one state (`durable=True`).
- `torch.distributed.checkpoint.save`: two gloo ranks, each saving its own arrays,
  fsynced, configured for speed (benchmarks/_dcp_save.py says how; the JSON's
  ``dcp_options`` what it got).
- The disk floor: the same bytes laid out as segue lays them out (each large array a
  file, the small ones packed in one), written as benchmarks.checkpoint's floor writes
  them (the threads of both gang writers, writeback started per file, fsynced).
  ``dcp_vs_disk`` is DCP's speed against it, and ``vs_dcp_at_disk_floor`` the most
  ``vs_dcp`` a side writing at the floor could reach on this disk.

Save i of every side is taken in turn, the order of the sides rotating with i
(Conductor): a side saves only while every other side waits, asleep, with its next
arrays ready. So the saves of one i fall within a second or so of each other, and
this VM's disk, whose slow periods last seconds, treats them alike. Each ratio is the
median over i of the ratio of save i of two sides (its quartiles, and the ratio of
the sides' best saves, are printed beside it); ratios of each side's best or median,
taken over saves minutes apart, moved from 0.6 to 2.7 between runs of the same code.
Before every timed save, everything is flushed and what earlier saves wrote is
dropped from the page cache: this VM's memory is backed by the host only once
touched, and freed memory is handed back to it, so a write into pages the guest had
not touched (the page cache of a side that keeps its saves, as DCP's does) ran 2-6x
slower in the kernel than one into pages freed just before. A save is timed from its
call until it is committed; the two gang sides (segue's, DCP's) time rank 0 from a
point where both ranks met (a collective round of the gang, DCP's
``dist.barrier()``). Every array changes exactly before every save, and no two
arrays ever hold the same bytes, so no side can skip a write (a segue side whose
last two saves share a blob stops the benchmark). The final states of every side are
read back and checked equal before a ratio is printed.

Then the Ray figures of issue 12 (benchmarks/_ray_side.py, in a process and session of
its own), on a local ``ray.cluster_utils`` cluster: a head with num_cpus=0 and worker
nodes of ``--ray-node-cpus`` (3: a step's worker and two sub-workers) logical CPUs each, node health checks every 200 ms,
three missed = dead. Every side gets the same tries (``--quick`` 2, ``--smoke`` 1 on
3,000 records), rounds interleaved; every output is checked (record count and an
order-independent hash, as benchmarks.pipeline's digest) before any ratio is printed,
and a mismatch aborts.

- ``efficiency_2_workers``: the map step of benchmarks/flows/ray_map_flow.py (JSONL ->
  the transform of benchmarks.pipeline -> exactly-once JSONL sink, a checkpoint every
  second) with ``workers=2``, run by the real CLI on local processes over its run on Ray
  (``--executor ray``, one worker node): local work_s / Ray work_s (goal >= 0.8). work_s
  is the task's start to its success in the store. ``ray_workers_s`` and
  ``local_workers_s`` give 1, 2 and 4 workers (4 with a second worker node).
- ``vs_ray_data``: Ray Data on the same cluster, records and transform, limited to 2 CPUs
  (resource_limits), one read block per file, output fsynced, timed from before the
  pipeline to the fsynced output; its time over segue's on Ray with 2 workers (goal >= 1.2).
- ``node_loss_recovery_s``: a step on Ray (benchmarks/flows/ray_loss_flow.py) whose first
  attempt committed a checkpoint loses its node (``remove_node(allow_graceful=False)``, the
  node its attempt log names); the time until the second attempt committed its first
  checkpoint. Goal: at most Ray's node-death detection (``ray_node_death_detection_s``,
  health-check period x failure threshold) + 2 s.

A Ray side that fails or makes no progress for a while (``--ray-stall``) is null, its
reason under ``not_measured``; without Ray (or Ray Data) installed, so are its figures,
and the rest still runs. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from segue.checkpoint.io import DEFAULT_WORKERS

from . import _probe as pb
from ._floors import Layout, raw_write, settle
from .flows.gang_state import rank_state

FLOW = Path(__file__).parent / "flows" / "gang_flow.py"
Shape = tuple[int, int, int]  # a rank's state: MiB in its large arrays, how many large, how many small
DCP = Path(__file__).parent / "_dcp_save.py"
ROOT = Path(__file__).resolve().parent.parent
# Ray's node health checks on the benchmark's cluster: a lost node is declared dead
# after HEALTH_FAILURES missed checks, one every HEALTH_PERIOD_MS.
HEALTH_PERIOD_MS, HEALTH_FAILURES = 200, 3
RAY_FIGURES = ("efficiency_2_workers", "vs_ray_data", "node_loss_recovery_s")
# Printed whether or not Ray ran (null when it did not).
RAY_KEYS = (*RAY_FIGURES, "ray_node_death_detection_s", "ray_workers_s", "local_workers_s", "ray_data_2w_s",
            "ray_cluster")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _state(shape: Shape, k: int) -> dict[str, np.ndarray]:
    """Both ranks' arrays after k saves (every side's final state is checked against it)."""
    return {**rank_state(0, *shape, k), **rank_state(1, *shape, k)}


# The sides of the checkpoint figures, and how many ranks of each take part in a save.
SIDE_RANKS = {"gang": 2, "single": 1, "dcp": 2}


def _spawn(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:  # the child keeps its own descriptor
        return subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _tail(log: Path) -> str:
    """The end of a side's log (its directory is removed once the figures are taken)."""
    return log.read_text(errors="replace")[-2000:]


def start_segue(tmp: Path, gate: Path, side: str, shape: Shape, saves: int) -> subprocess.Popen[bytes]:
    """`segue run` of the flow with ``SIDE_RANKS[side]`` ranks, its saves conducted through ``gate``."""
    env = {**os.environ, "SEGUE_HOME": str(tmp / side), "SEGUE_POOL": str(tmp / f"pool-{side}.db"),
           "BENCH_RANKS": str(SIDE_RANKS[side]),
           # Keep every checkpoint: a gang's coordinator prunes after its ranks go on, so
           # pruning would run beside the next side's timed save (disk: saves x the state).
           "BENCH_KEEP": str(saves + 1)}
    return _spawn([sys.executable, "-m", "segue", "run", str(FLOW), "--run-id", "b", "-p", f"mb={shape[0]}",
                   "-p", f"large={shape[1]}", "-p", f"small={shape[2]}", "-p", f"k={saves}", "-p", f"gate={gate}", "-p", f"side={side}"], tmp / f"{side}.log", env)


def segue_state(tmp: Path, side: str) -> dict[str, np.ndarray]:
    """The final state of a segue side, read back from its last committed checkpoint
    (every rank's shard); SystemExit if its last two saves share a blob (an array that
    did not change is not written again: the sides would not do the same work)."""
    from segue import checkpoint as ckpt
    from segue.home import Home

    h = Home.resolve(tmp / side)
    store = h.open_store()
    try:
        storage = h.run_storage(store.get_run("b"))
        last, before = (c.path for c in store.list_checkpoints("b", "save")[:2])

        def shards(path: str) -> list[str]:
            if SIDE_RANKS[side] == 1:
                return [path]
            return [r["path"] for r in ckpt.load(storage, path).state["state"]["gang"]["ranks"]]

        def blobs(path: str) -> set[str]:
            return {name for shard in shards(path) for name in ckpt.read_manifest(storage, shard).files}

        shared = blobs(last) & blobs(before)
        if shared:
            raise SystemExit(f"{side}'s last two saves share {len(shared)} blob(s): an array did not "
                             "change between saves, so segue did less work than DCP; no ratio is printed")
        state: dict[str, np.ndarray] = {}
        for shard in shards(last):
            state.update(ckpt.load(storage, shard).state["state"])
        return state
    finally:
        store.close()


def start_dcp(tmp: Path, gate: Path, shape: Shape, saves: int) -> subprocess.Popen[bytes] | str:
    """torch.distributed.checkpoint's side, or why there is none."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    return _spawn([sys.executable, str(DCP), str(_free_port()), *map(str, shape), str(saves), str(tmp / "dcp"),
                   str(gate)], tmp / "dcp.log")


def dcp_state(tmp: Path, shape: Shape, saves: int) -> dict[str, np.ndarray]:
    import torch
    import torch.distributed.checkpoint as dcp

    back = {key: torch.zeros(a.shape, dtype=torch.float32) for key, a in _state(shape, 0).items()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(back, checkpoint_id=str(tmp / "dcp" / f"save-{saves - 1}"))
    return {key: t.numpy() for key, t in back.items()}


def settle_sides(tmp: Path) -> None:
    """Every side starts each timed save on a settled disk and with the same warm memory
    (_floors.settle): what earlier saves of every side wrote is dropped, never a store's files."""
    settle(*(tmp / data for data in ("gang/data", "single/data", "dcp")))


class Conductor:
    """Runs every side's saves in turn, one save at a time on the whole machine.

    A side's rank says ``ready-SIDE-RANK-i`` (its arrays changed for save i) on the
    ``inbox`` FIFO, then blocks reading its own FIFO ``go-SIDE-RANK-i``; rank 0 says
    ``done-SIDE-i=SECONDS`` once the save is committed (benchmarks/flows/gang_flow.py
    has the sides' half). The conductor lets a side go only once every side is ready,
    and the next only once this one is done and ready again. Nothing polls: a waiting
    side or conductor sleeps in a read, so no side's save shares the CPU with the
    others' waiting. Save i of every side falls within a second or so: the disk's
    slow periods, which last seconds, hit the sides of one save alike, and each
    save's pair gives a ratio."""

    def __init__(self, gate: Path, procs: dict[str, subprocess.Popen[bytes]], saves: int,
                 timeout: float = 600.0) -> None:
        self.gate, self.procs, self.timeout = gate, procs, timeout
        for side in procs:
            for rank in range(SIDE_RANKS[side]):
                for i in range(saves + 1):  # the last: leave, once every save is timed
                    os.mkfifo(gate / f"go-{side}-{rank}-{i}")
        self.said: dict[str, str] = {}
        self._buf = b""

    def __enter__(self) -> Conductor:
        os.mkfifo(self.gate / "inbox")
        # Read and write: the FIFO never reads as closed between two sides' messages.
        self._fd = os.open(self.gate / "inbox", os.O_RDWR)
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)

    def _check(self, waiting_for: str, deadline: float) -> None:
        for side, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"the {side} side exited ({p.returncode}) before {waiting_for}:\n"
                                   + _tail(self.gate.parent / f"{side}.log"))
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {waiting_for} within {self.timeout:g}s")

    def wait(self, name: str) -> str:
        deadline = time.monotonic() + self.timeout
        while name not in self.said:
            self._check(name, deadline)
            if select.select([self._fd], [], [], 1.0)[0]:
                self._buf += os.read(self._fd, 65536)
                *lines, self._buf = self._buf.split(b"\n")
                for line in lines:
                    key, _, value = line.decode().partition("=")
                    self.said[key] = value
        return self.said[name]

    def ready(self, side: str, i: int) -> None:
        for rank in range(SIDE_RANKS[side]):
            self.wait(f"ready-{side}-{rank}-{i}")

    def go(self, side: str, i: int) -> None:
        deadline = time.monotonic() + self.timeout
        for rank in range(SIDE_RANKS[side]):
            while True:
                try:  # the rank said it is ready: its read end opens at once
                    fd = os.open(self.gate / f"go-{side}-{rank}-{i}", os.O_WRONLY | os.O_NONBLOCK)
                    break
                except OSError as e:
                    if e.errno != errno.ENXIO:
                        raise
                    self._check(f"go-{side}-{rank}-{i} opened", deadline)
                    time.sleep(0.001)
            os.write(fd, b"g")
            os.close(fd)

    def save(self, side: str, i: int) -> float:
        settle_sides(self.gate.parent)
        self.go(side, i)
        t = float(self.wait(f"done-{side}-{i}"))
        self.ready(side, i + 1)  # its next arrays changed: nothing of it runs from here on
        return t


def paired_saves(tmp: Path, shape: Shape, saves: int) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Every side's save times, save i of each side taken in turn (the order of the
    sides rotating with i), and the final states checked equal to the expected. Also
    what DCP's side used (``dcp_options``), or why it was skipped (``dcp_skipped``)."""
    gate = tmp / "gate"
    gate.mkdir()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    said: dict[str, str] = {}
    try:
        dcp = start_dcp(tmp, gate, shape, saves)
        if isinstance(dcp, str):
            said["dcp_skipped"] = dcp
        else:
            procs["dcp"] = dcp
        for side in ("gang", "single"):
            procs[side] = start_segue(tmp, gate, side, shape, saves)
        with Conductor(gate, procs, saves) as run:
            for side in procs:
                run.ready(side, 0)
            raw_state = list(_state(shape, 0).values())
            times: dict[str, list[float]] = {side: [] for side in ("gang", "single", "dcp", "raw")
                                             if side in procs or side == "raw"}
            order = list(times)
            # The floor: as benchmarks.checkpoint's, with the threads of both gang ranks' writers.
            with ThreadPoolExecutor(2 * DEFAULT_WORKERS) as pool:
                for i in range(saves):
                    for a in raw_state:
                        a += 1.0
                    lay = Layout(raw_state)
                    for side in order[i % len(order):] + order[: i % len(order)]:
                        if side != "raw":
                            times[side].append(run.save(side, i))
                            continue
                        settle_sides(tmp)
                        t0 = time.perf_counter()
                        raw_write(tmp / "raw", lay, pool)
                        times["raw"].append(time.perf_counter() - t0)
                        shutil.rmtree(tmp / "raw")
            for side in procs:
                run.go(side, saves)
        for side, p in procs.items():
            if p.wait(timeout=600) != 0:
                raise RuntimeError(f"the {side} side failed (exit {p.returncode}):\n" + _tail(tmp / f"{side}.log"))
    finally:
        for p in procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    want = _state(shape, saves)
    for side in procs:
        got = dcp_state(tmp, shape, saves) if side == "dcp" else segue_state(tmp, side)
        if got.keys() != want.keys() or not all(np.array_equal(got[key], w) for key, w in want.items()):
            raise SystemExit(f"the final state of {side} differs from the expected: no ratio is printed")
    if "dcp" in procs:
        said["dcp_options"] = (tmp / "dcp" / "options.txt").read_text()
    return times, said


def checkpoint_figures(tmp: Path, shape: Shape, saves: int) -> dict[str, Any]:
    """The checkpoint figures of one state shape (its files removed after)."""
    tmp.mkdir()
    try:
        times, said = paired_saves(tmp, shape, saves)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # before the next part: the disk to itself
    mb, large, small = shape
    out: dict[str, Any] = {
        "state": {"ranks": 2, "mib_per_rank": mb, "large_per_rank": large, "small_per_rank": small,
                  "bytes_per_save": sum(a.nbytes for a in _state(shape, 0).values())},
        "saves_per_side": saves,
        **{("raw_write_s" if side == "raw" else f"{side}_save_s"): round(min(t), 4) for side, t in times.items()},
        "median_save_s": {side: round(statistics.median(t), 4) for side, t in times.items()},
        "states_equal": True,  # every side's final state was checked by paired_saves; a mismatch exits
        "samples": {side: [round(x, 4) for x in t] for side, t in times.items()},
    }
    # Each ratio is the median over i of the ratio of save i of two sides, taken within
    # a second or so of each other (Conductor); its quartiles, and the ratio of the two
    # sides' best saves, are printed beside it.
    ratios = {"gang_ckpt_vs_single": ("gang", "single"), "gang_vs_disk": ("raw", "gang"),
              "vs_dcp": ("dcp", "gang"), "dcp_vs_disk": ("raw", "dcp"), "vs_dcp_at_disk_floor": ("dcp", "raw")}
    out["ratio_quartiles"], out["best_of"] = {}, {}
    for key, (num, den) in ratios.items():
        if num not in times or den not in times:
            out[key] = None
            continue
        paired = [x / y for x, y in zip(times[num], times[den], strict=True)]
        out[key] = round(statistics.median(paired), 3)
        if len(paired) > 1:
            out["ratio_quartiles"][key] = [round(x, 3) for x in statistics.quantiles(paired, n=4, method="inclusive")]
        out["best_of"][key] = round(min(times[num]) / min(times[den]), 3)
    if "dcp_skipped" in said:
        out["dcp_save_s"] = None
    out.update(said)
    return out


def ray_side(tmp: Path, records: int, tries: int, node_cpus: int, stall_s: float,
             run_timeout: float) -> dict[str, Any] | str:
    """The Ray figures (benchmarks._ray_side, in a session of its own), or why there are none."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed (pip install 'segue[ray]')"
    cmd = [sys.executable, "-m", "benchmarks._ray_side", "--records", str(records), "--tries", str(tries),
           "--work", str(tmp / "ray"), "--node-cpus", str(node_cpus), "--stall", str(stall_s),
           "--timeout", str(run_timeout), "--health-period-ms", str(HEALTH_PERIOD_MS),
           "--health-failures", str(HEALTH_FAILURES)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=run_timeout * (8 * tries + 4))
    except BaseException:  # SIGTERM first: it shuts its cluster down and ends its runs
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        return "the Ray side did not end in time"
    if proc.returncode == 3:  # an output differs: no ratio may be printed
        raise SystemExit(err.strip().splitlines()[-1])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return f"the Ray side failed (exit {proc.returncode}): {err.strip()[-800:]}"
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="tiny states: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ray-node-cpus", type=int, default=3,
                    help="logical CPUs of each Ray worker node (2 sub-workers and their coordinator)")
    ap.add_argument("--ray-stall", type=float, default=None,
                    help="seconds without progress after which a run on Ray counts as stuck")
    a = ap.parse_args(argv)
    # The model-shaped state (the goals'), and one tensor per rank (disk-bound: printed beside).
    model, one = ((1, 2, 10), (1, 1, 0)) if a.smoke else ((64, 8, 1000), (64, 1, 0)) if a.quick \
        else ((256, 16, 2000), (256, 1, 0))
    saves = 2 if a.smoke else 15 if a.quick else 24
    # Enough records that the step's work, not the start of its actors, is timed.
    records, tries = (3000, 1) if a.smoke else (3_000_000, 2) if a.quick else (6_000_000, 3)
    stall = a.ray_stall or (20.0 if a.smoke else 60.0)
    notes = pb.byte_compile_segue()
    tmp = Path(tempfile.mkdtemp(prefix="segue-scale-"))
    try:
        out = checkpoint_figures(tmp / "model", model, saves)
        out["one_tensor"] = checkpoint_figures(tmp / "one", one, saves)
        ray = ray_side(tmp, records, tries, a.ray_node_cpus, stall, 180.0 if a.smoke else 900.0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    not_measured: dict[str, str] = {}
    if isinstance(ray, str):
        out.update({key: None for key in RAY_KEYS})
        not_measured.update({key: ray for key in RAY_FIGURES})
    else:
        not_measured.update(ray.pop("ray_skipped", {}))
        out.update(ray)
        for key, side in (("efficiency_2_workers", "ray_2w"), ("vs_ray_data", "ray_data_2w"),
                          ("vs_ray_data", "ray_2w"), ("node_loss_recovery_s", "node_loss_recovery_s")):
            if out[key] is None and side in not_measured and key not in not_measured:
                not_measured[key] = not_measured[side] if side == key else f"see {side}"
    out["not_measured"] = not_measured
    detection = HEALTH_PERIOD_MS * HEALTH_FAILURES / 1000
    out["goals"] = pb.goals(out, {"gang_ckpt_vs_single": ("<=", 1.3), "vs_dcp": (">=", 1.5),
                                  "efficiency_2_workers": (">=", 0.8), "vs_ray_data": (">=", 1.2),
                                  "node_loss_recovery_s": ("<=", round(detection + 2.0, 3))})
    if a.smoke:
        notes.append("--smoke: 1 MiB states, 3,000 records, one try; figures mean nothing, the run "
                     "checks it works")
    out["notes"] = notes
    if not a.json:
        for key, v in out.items():
            print(f"{key:>22}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
