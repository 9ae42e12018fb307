"""Many machines, one truth: failover time, store throughput, checkpoints on S3.

    python -m benchmarks.cluster --quick --json

Everything runs on this machine, through the real engine: a throwaway
PostgreSQL server with durable commits (``fsync=on``, ``synchronous_commit=on``,
as SQLite's ``synchronous=FULL`` beside it), an S3 API server (moto) on
loopback, and `segue agent` processes that each play one host.

* **Failover.** Two hosts (agents a and b) share the database and the bucket.
  A map step with a sink runs on host a; once it has committed a checkpoint,
  host a dies (its agent and controller are SIGKILLed; the workers die with
  the controller). ``failover_s`` is the time from the kill to the run being
  driven by a live controller on host b, ``failover_to_step_s`` to its step
  running there. The floor beside it is the lease TTL (a dead host is only
  known dead once its lease expires) plus a worker's start-up. The output is
  counted: ``lost_records`` and ``dup_records`` against the input.
* **Store throughput.** 1, 4 and 16 writer processes, each on a run of its
  own, alternate a fenced heartbeat with a run transition (RUNNING <->
  PAUSING, each an event) for a fixed time, on PostgreSQL and on SQLite;
  writes per second, and the ratio (information only: on two cores the server
  and the writers share the CPU); beside them the disk's fsyncs per second
  (the ceiling of one serialised durable writer).
* **Task transitions against raw psycopg.** 16 writer processes, each on two runs
  of its own, move a task RUNNING -> RETRYING (``transition_task``, fenced,
  counting a failure) and back (``start_attempt``, a new epoch):
  ``pg_task_transitions_per_s_16_writers``. The floor beside it,
  ``raw_psycopg_transitions_per_s_16_writers``, is a plain psycopg loop on the
  same server and schema that commits the same rows per transition (the task's
  update, its event, a commit marker) in one statement in autocommit, with the
  server's ``synchronous_commit`` (reported) as segue has it, but no lock order,
  no fencing or state check and no record read back. The same processes run
  both sides in turn, in short slices that alternate (quick: 10 pairs of 0.5 s),
  so the load of a shared machine treats both alike; ``pg_vs_raw_psycopg_16_writers``
  is the median of the pairs' ratios (quartiles beside it), the rates are the
  sides' medians.
* **Checkpoints on S3.** The same state (arrays and a JSON tree) saved and
  restored through ``segue.checkpoint`` to the S3 server and to local disk;
  both restores are checked equal to the state before the ratio is printed.

``--part`` runs one part (``failover``, ``writes``, ``tasks``, ``s3``); the last line
printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from . import _probe as pb

ROOT = Path(__file__).resolve().parent
FLOW = ROOT / "flows" / "cluster_flow.py"
sys.path.insert(0, str(ROOT.parent / "tests"))  # the throwaway server helpers the tests use too


# -- servers ---------------------------------------------------------------------------------
def start_s3() -> tuple[Any, str]:
    import logging
    import socket

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    return server, f"http://127.0.0.1:{port}"


def bucket(endpoint: str) -> tuple[str, dict[str, str]]:
    from s3kit import s3_bucket

    return s3_bucket(endpoint)


# -- failover ----------------------------------------------------------------------------------
def _agent(env: dict[str, str], host: str, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "segue", "agent", "--host-id", host], stdout=f,
                                stderr=subprocess.STDOUT, env=env)


def failover(work: Path, url: str, endpoint: str, n: int) -> dict[str, Any]:
    from segue.states import RunState
    from segue.store.postgres import PostgresStore

    name, aws = bucket(endpoint)
    os.environ.update(aws)
    base = {**os.environ, **aws, "SEGUE_STORE": url, "SEGUE_CHECKPOINTS": f"s3://{name}/runs",
            "PYTHONUNBUFFERED": "1"}
    envs = {h: {**base, "SEGUE_HOME": str(work / h / "home"), "SEGUE_POOL": str(work / h / "pool.db"),
                "SEGUE_HOST_ID": h} for h in "ab"}
    for h in "ab":
        (work / h).mkdir(parents=True)
    inp, out = work / "input.jsonl", work / "out"
    with open(inp, "w") as f:
        for k in range(n):
            f.write(json.dumps({"k": k, "text": f"record {k}"}) + "\n")
    store = PostgresStore(url)
    agents = {h: _agent(envs[h], h, work / f"agent-{h}.log") for h in "ab"}
    try:
        pb.wait_until(lambda: {x.host for x in store.list_hosts() if x.alive(store.now())} == {"a", "b"}, 120,
                      poll=0.05, what="both agents to register")
        proc = subprocess.run([sys.executable, "-m", "segue", "run", str(FLOW), "--detach", "--run-id", "fo",
                               "-p", f"input={inp}", "-p", f"out={out}"], env=envs["a"], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode:
            raise RuntimeError(f"segue run: {proc.stderr.strip()[-400:]}")

        def committed() -> bool:
            t = store.get_task("fo", "tag")
            return bool(t.host == "a" and store.list_checkpoints("fo", "tag"))

        pb.wait_until(committed, 300, poll=0.05, what="a checkpoint on host a")
        r = store.get_run("fo")
        ttl = float(r.options.get("lease_ttl_s", 10.0))
        assert r.controller_pid is not None  # its controller is up: the step committed
        t0 = time.monotonic()
        for pid in (agents["a"].pid, r.controller_pid):
            os.kill(pid, signal.SIGKILL)
        agents["a"].wait()
        pb.wait_until(lambda: (x := store.get_run("fo")).controller_host == "b"
                      and x.controller_alive(store.now()), 300, poll=0.02, what="host b to take over")
        failover_s = time.monotonic() - t0
        pb.wait_until(lambda: (t := store.get_task("fo", "tag")).host == "b" and t.state.value == "RUNNING",
                      300, poll=0.02, what="the step running on host b")
        to_step_s = time.monotonic() - t0
        pb.wait_until(lambda: store.get_run("fo").state in (RunState.SUCCEEDED, RunState.FAILED), 600,
                      poll=0.1, what="the run to end")
        state = store.get_run("fo").state
        keys = [json.loads(line)["k"] for p in sorted(out.glob("part-*.jsonl")) for line in p.open()]
        return {"failover_s": failover_s, "failover_to_step_s": to_step_s, "failover_lease_ttl_s": ttl,
                "run_state": state.value, "lost_records": n - len(set(keys)),
                "dup_records": len(keys) - len(set(keys))}
    finally:
        for p in agents.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
        store.close()


# -- store throughput --------------------------------------------------------------------------
def writer(target: str, run_id: str, seconds: float) -> None:
    """One writer process: prints how many writes it committed in ``seconds``."""
    from segue.states import Actor, RunState, TaskState
    from segue.store import NewRun
    from segue.store.postgres import PostgresStore
    from segue.store.sqlite import SQLiteStore

    store = PostgresStore(target) if "://" in target else SQLiteStore(target)
    store.create_run(NewRun(run_id, "bench", "/dev/null", {}, {}), ["s"], actor=Actor.CLI)
    store.transition_run(run_id, RunState.RUNNING, actor=Actor.CLI, reason="bench")
    epoch = store.start_attempt(run_id, "s", ttl_s=60, actor=Actor.CONTROLLER).epoch
    assert store.get_task(run_id, "s").state == TaskState.RUNNING
    print("ready", flush=True)
    sys.stdin.readline()
    n, flip, end = 0, RunState.PAUSING, time.monotonic() + seconds
    while time.monotonic() < end:
        store.heartbeat(run_id, "s", epoch, 60)
        store.transition_run(run_id, flip, actor=Actor.CLI, reason="bench")
        flip = RunState.RUNNING if flip == RunState.PAUSING else RunState.PAUSING
        n += 2
    print(n, flush=True)
    store.close()


# The raw side's two transitions: the same rows a segue transition commits (the task's
# columns, its event, a commit marker), one statement each; the loop keeps the counters.
_RAW_MARK = ("WITH m AS (INSERT INTO commit_markers (token, at)"
             " VALUES (%(token)s, extract(epoch FROM clock_timestamp())) RETURNING at)")
_RAW_EVENT = ("INSERT INTO events (run_id, step, time, actor, kind, from_state, to_state, reason, data)"
              " SELECT %(run)s, 's', u.at, 'controller', 'task', %(frm)s, %(to)s, %(reason)s, %(data)s FROM u")
RAW_RETRY = (_RAW_MARK + ", u AS (UPDATE tasks SET state = 'RETRYING', failures = failures + 1,"
             " next_attempt_at = 0.0, finished_at = NULL, updated_at = m.at, pid = NULL, host = NULL,"
             " lease_until = NULL FROM m WHERE run_id = %(run)s AND step = 's' RETURNING m.at) " + _RAW_EVENT)
RAW_START = (_RAW_MARK + ", u AS (UPDATE tasks SET state = 'RUNNING', epoch = %(epoch)s,"
             " attempts = %(epoch)s, pid = NULL, host = NULL, lease_until = m.at + 60,"
             " next_attempt_at = NULL, started_at = COALESCE(started_at, m.at), finished_at = NULL,"
             " updated_at = m.at FROM m WHERE run_id = %(run)s AND step = 's' RETURNING m.at) " + _RAW_EVENT)


def task_writer(target: str, run_id: str, seconds: float) -> None:
    """One writer of both sides, on a run of each: for every line ``segue`` or ``raw`` on
    stdin it moves its task for ``seconds`` on that side and prints how many transitions
    it committed; ``quit`` ends it. segue: ``transition_task`` RUNNING -> RETRYING
    (fenced, counting a failure) and ``start_attempt`` back. raw: a plain psycopg loop
    committing the same rows per transition (the task's columns, its event, a marker)."""
    import uuid

    import psycopg

    from segue.states import Actor, TaskState
    from segue.store import NewRun
    from segue.store.postgres import PostgresStore

    store = PostgresStore(target)
    epochs = {}
    for side in ("segue", "raw"):
        store.create_run(NewRun(f"{run_id}-{side}", "bench", "/dev/null", {}, {}), ["s"], actor=Actor.CLI)
        epochs[side] = store.start_attempt(f"{run_id}-{side}", "s", ttl_s=60, actor=Actor.CONTROLLER).epoch
    seg, raw = f"{run_id}-segue", f"{run_id}-raw"
    with psycopg.connect(target, autocommit=True) as conn:
        print("ready", flush=True)
        for line in sys.stdin:
            side = line.strip()
            if side == "quit":
                break
            n, end = 0, time.monotonic() + seconds
            while time.monotonic() < end:
                if side == "segue":
                    store.transition_task(seg, "s", TaskState.RETRYING, actor=Actor.CONTROLLER, reason="bench",
                                          epoch=epochs[side], count_failure=True, next_attempt_at=0.0)
                    epochs[side] = store.start_attempt(seg, "s", ttl_s=60, actor=Actor.CONTROLLER).epoch
                else:
                    e = epochs[side]
                    conn.execute(RAW_RETRY, {"token": uuid.uuid4(), "run": raw, "frm": "RUNNING", "to": "RETRYING",
                                             "reason": "bench", "data": json.dumps({"epoch": e}, separators=(",", ":"))})
                    epochs[side] = e = e + 1
                    conn.execute(RAW_START, {"token": uuid.uuid4(), "run": raw, "epoch": e, "frm": "RETRYING",
                                             "to": "RUNNING", "reason": f"attempt {e} started",
                                             "data": json.dumps({"attempt": e, "epoch": e}, separators=(",", ":"))})
                n += 2
            print(n, flush=True)
    for side, rid in (("segue", seg), ("raw", raw)):  # every transition committed, none twice
        if store.get_task(rid, "s").epoch != epochs[side]:
            raise RuntimeError(f"run {rid}: the store holds another epoch than this writer reached")
    store.close()


WRITERS = {"mixed": writer, "tasks": task_writer}


def throughput(target: str, writers: int, seconds: float, tag: str, mode: str = "mixed") -> float:
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.cluster", "--writer", target, f"{tag}-{i}",
                               str(seconds), "--writer-mode", mode], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT.parent) for i in range(writers)]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a writer failed to start")
    t0 = time.monotonic()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    total = sum(int(p.communicate(timeout=seconds + 120)[0].strip()) for p in procs)
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a {mode} writer failed")
    return total / max(time.monotonic() - t0, seconds)


def task_transitions(target: str, writers: int, seconds: float, slices: int) -> dict[str, Any]:
    """segue's task transitions per second against the raw psycopg floor. The same
    ``writers`` processes run both sides in turn, ``slices`` slices of ``seconds`` each,
    alternating (which side goes first alternates too), so a slow period of this
    shared machine treats both alike; the ratio is the median of the pairs' ratios."""
    import statistics

    import psycopg

    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.cluster", "--writer", target, f"t{i}",
                               str(seconds), "--writer-mode", "tasks"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, cwd=ROOT.parent) for i in range(writers)]
    rates: dict[str, list[float]] = {"segue": [], "raw": []}
    try:
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError("a task writer failed to start")
        for i in range(slices):
            for side in (("segue", "raw") if i % 2 == 0 else ("raw", "segue")):
                t0 = time.monotonic()
                for p in procs:
                    assert p.stdin is not None
                    p.stdin.write(side + "\n")
                    p.stdin.flush()
                total = sum(int(p.stdout.readline()) for p in procs if p.stdout is not None)
                rates[side].append(total / max(time.monotonic() - t0, seconds))
    finally:
        for p in procs:
            if p.poll() is None and p.stdin is not None:
                p.stdin.write("quit\n")
                p.stdin.close()
        if any(p.wait(120) for p in procs):
            raise RuntimeError("a task writer failed")
    with psycopg.connect(target, autocommit=True) as conn:
        row = conn.execute("SHOW synchronous_commit").fetchone()
    ratios = sorted(a / b for a, b in zip(rates["segue"], rates["raw"], strict=True))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {f"pg_task_transitions_per_s_{writers}_writers": statistics.median(rates["segue"]),
            f"raw_psycopg_transitions_per_s_{writers}_writers": statistics.median(rates["raw"]),
            f"pg_vs_raw_psycopg_{writers}_writers": statistics.median(ratios),
            f"pg_vs_raw_psycopg_{writers}_writers_quartiles": [q[0], q[2]],
            "task_transition_slices": rates, "task_transition_slice_s": seconds,
            "synchronous_commit": row[0] if row else None}


def fsync_per_s(where: Path, seconds: float) -> float:
    """The physical ceiling of one serialised durable writer: 4 KiB write + fsync per commit."""
    where.mkdir(parents=True, exist_ok=True)
    fd = os.open(where / "fsync.probe", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        n, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < seconds:
            os.pwrite(fd, b"x" * 4096, 0)
            os.fsync(fd)
            n += 1
        return n / (time.monotonic() - t0)
    finally:
        os.close(fd)


# -- checkpoints on S3 ---------------------------------------------------------------------------
def s3_checkpoints(work: Path, endpoint: str, mib: int, tries: int) -> dict[str, Any]:
    from segue.checkpoint import load, save
    from segue.home import storage_at

    work.mkdir(parents=True, exist_ok=True)
    name, aws = bucket(endpoint)
    os.environ.update(aws)
    rng = np.random.default_rng(0)
    state: dict[str, Any] = {"w": rng.standard_normal(mib * 2**20 // 8 // 2),
                             "m": rng.standard_normal(mib * 2**20 // 8 // 2),
                             "step": 7, "config": {"lr": 0.1, "name": "bench"}}
    out: dict[str, list[float]] = {"local_save": [], "local_restore": [], "s3_save": [], "s3_restore": []}
    for i in range(tries):
        for side, url in (("local", str(work / f"ck{i}")), ("s3", f"s3://{name}/ck{i}")):
            storage = storage_at(url)
            t0 = time.perf_counter()
            save(storage, "run/c1", state)
            out[f"{side}_save"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            got = load(storage, "run/c1").state
            out[f"{side}_restore"].append(time.perf_counter() - t0)
            if not (np.array_equal(got["w"], state["w"]) and np.array_equal(got["m"], state["m"])
                    and got["config"] == state["config"] and got["step"] == 7):
                raise RuntimeError(f"the {side} restore differs from the state saved")
    best = {k: min(v) for k, v in out.items()}
    return {"ckpt_mib": mib, **{f"ckpt_{k}_s": v for k, v in best.items()},
            "s3_vs_local_save": best["local_save"] / best["s3_save"],
            "s3_vs_local_restore": best["local_restore"] / best["s3_restore"]}


# -- main ------------------------------------------------------------------------------------------
PARTS = ("failover", "writes", "tasks", "s3")

def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and a 3 s lease: checks the harness")
    p.add_argument("--json", action="store_true")
    p.add_argument("--part", choices=PARTS, action="append",
                   help="run only this part (repeatable); default: all")
    p.add_argument("--writer", nargs=3, metavar=("TARGET", "RUN", "SECONDS"), help=argparse.SUPPRESS)
    p.add_argument("--writer-mode", choices=sorted(WRITERS), default="mixed", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.writer:
        WRITERS[a.writer_mode](a.writer[0], a.writer[1], float(a.writer[2]))
        return 0
    parts = set(a.part or PARTS)
    import pgserver

    reason = pgserver.skip_reason()
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    seconds, n, mib, tries = (2.0, 4000, 32, 2) if a.quick else (5.0, 20000, 256, 3)
    slice_s, slices = (0.5, 10) if a.quick else (1.0, 20)
    writer_counts: tuple[int, ...] = (1, 4, 16)
    if a.smoke:  # a short lease (failover ~3 s); the figures mean nothing at this size
        seconds, n, mib, tries = 0.5, 1000, 2, 1
        slice_s, slices = 0.2, 2
        writer_counts = (1, 16)
        os.environ["SEGUE_LEASE_TTL_S"] = "3"
    work = Path(tempfile.mkdtemp(prefix="segue-bench-cluster-"))
    pg = pgserver.PgServer.start(durable=True)
    s3, endpoint = start_s3()
    result: dict[str, Any] = {"bench": "cluster", "quick": a.quick, "smoke": a.smoke,
                              "parts": sorted(parts), "notes": [f"load average {os.getloadavg()}"]}
    try:
        if "failover" in parts:
            result.update(failover(work / "failover", pg.create_database(), endpoint, n))
            result["worker_startup_s"] = pb.worker_startup_s()
            result["failover_over_ttl"] = result["failover_s"] / result["failover_lease_ttl_s"]
        if "writes" in parts:
            for w in writer_counts:
                pg_ops = throughput(pg.create_database(), w, seconds, "pg")  # one try per side
                db = work / f"sqlite-{w}" / "segue.db"
                db.parent.mkdir(parents=True)
                sq_ops = throughput(str(db), w, seconds, "sq")
                result[f"pg_writes_per_s_{w}_writers"] = pg_ops
                result[f"sqlite_writes_per_s_{w}_writers"] = sq_ops
                result[f"pg_vs_sqlite_{w}_writers"] = pg_ops / sq_ops  # information only
            result["fsync_per_s"] = fsync_per_s(work / "disk", seconds)
        if "tasks" in parts:
            result.update(task_transitions(pg.create_database(), 16, slice_s, slices))
        if "s3" in parts:
            result.update(s3_checkpoints(work / "ckpt", endpoint, mib, tries))
    finally:
        s3.stop()
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)
    lost = result.get("lost_records", 0) + result.get("dup_records", 0) if "failover" in parts else None
    result["goals"] = pb.goals(
        {**result, "lost_and_dup": lost,
         "failover_s_minus_ttl": result["failover_s"] - result["failover_lease_ttl_s"]
         if "failover" in parts else None},
        {"failover_s_minus_ttl": ("<=", 2.0), "lost_and_dup": ("<=", 0),
         "pg_vs_raw_psycopg_16_writers": (">=", 0.7)})
    if not a.json:
        for k, v in result.items():
            print(f"{k:36} {v}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
