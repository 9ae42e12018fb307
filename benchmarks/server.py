"""Throughput, latency and memory of `segue server`, over a real server process.

    python -m benchmarks.server --quick --json
    python -m benchmarks.server --smoke --json        # seconds; CI runs it

One `segue --home H server` subprocess on 127.0.0.1 with a home and a host pool
of its own, one run of ``benchmarks/flows/recovery_flow.py`` executing through
it (a pause point every 10 ms, a checkpoint every second). The load generator
is this process: asyncio with one ``httpx.AsyncClient`` (one connection) per
simulated client, on the same machine as the server, so both share its CPUs.

* ``requests_per_s``: GET /api/runs/{id} (the status document) from ``clients``
  concurrent clients, each sending its next request when the last answered
  (closed loop, saturating); ``status_p99_saturated_s`` is the p99 latency there.
* ``status_p99_s``: the p99 latency of the same request when ``paced_clients``
  clients (dashboards) ask once a second each, an offered load the server can
  serve; ``status_p99_1client_s``: one client, one request at a time.
* ``pause_to_paused_s``: POST /api/runs/{id}/pause with ``wait=true`` on the
  running run, from the request to the answer (stored state PAUSED); beside it
  ``segue pause RUN --wait`` through the CLI, from the process start to its exit
  (``pause_to_paused_cli_s``) and as the CLI reports itself, without its start-up
  (``pause_to_paused_cli_inner_s``). Sides alternate; each gets ``pause_tries``
  tries; the run is resumed through the API between tries and every try starts
  once the new attempt has made progress (observed in the status, no fixed sleep).
* ``runs_page_10k_s``: GET /api/runs?limit=50 with ``runs_stored`` runs in the
  store (created in this process through ``Store.create_run``; the fill is set-up,
  not measured, so its connection skips the fsync at commit); also the last page,
  and GET / when the web UI is there.
* ``server_rss_bytes``: the server's VmRSS (/proc/PID/status) after all of that;
  ``server_open_fds`` likewise.

Figures are medians of their tries unless named p99 or max. Errors (any non-2xx
answer or transport error during the loads) are counted, never dropped. The
last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from . import _probe as pb

FLOW = Path(__file__).parent / "flows" / "recovery_flow.py"
STEP = "work"

GOALS = {  # key: (comparison, target)
    "status_p99_s": ("<=", 0.05),
    "runs_page_10k_s": ("<=", 1.0),
}


# -- the server process ---------------------------------------------------------------
# (tests/serverkit.py does the same for the tests; benchmarks do not import tests)

class Server:
    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.pool = root / "pool.db"
        self.err = root / "server.stderr"
        self.env = {**os.environ, "SEGUE_POOL": str(self.pool), "PYTHONUNBUFFERED": "1"}
        self.env.pop("SEGUE_FAULTS", None)
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.token = ""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def start(self) -> None:
        for _ in range(5):  # the free port can be taken between the probe and the bind
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
            with open(self.err, "wb") as err:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "segue", "--home", str(self.home), "server", "--port",
                     str(self.port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    env=self.env)
            if pb.wait_until(self._up_or_dead, 120, 0.05) == "up":
                lines = self.err.read_text().splitlines()
                self.token = lines[1].strip()  # line 2: the bootstrap admin token
                return
            if "address already in use" not in self.err.read_text().lower():
                break
        raise RuntimeError(f"segue server did not start:\n{self.err.read_text()}")

    def _up_or_dead(self) -> str | None:
        assert self.proc is not None
        if self.proc.poll() is not None:
            return "dead"
        try:
            return "up" if httpx.get(self.url + "/healthz", timeout=5).status_code == 200 else None
        except httpx.TransportError:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * (1024 if line.rstrip().endswith("kB") else 1)
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


# -- measurements -----------------------------------------------------------------------

def pctl(xs: list[float], q: float) -> float:
    """The q-th quantile (nearest rank) of ``xs``."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]


async def _load(srv: Server, path: str, clients: int, seconds: float, pace_s: float | None,
                seed: int) -> dict[str, Any]:
    """``clients`` clients GET ``path`` for ``seconds``: back to back (``pace_s`` None),
    or each once per ``pace_s`` at a random phase (late answers push the next one back)."""
    lat: list[float] = []
    errors: dict[str, int] = {}
    rnd = random.Random(seed)
    # Every client is made before the clock starts, with one shared TLS context: httpx
    # builds one per client otherwise, tens of ms of CPU each, which would be timed.
    tls = ssl.create_default_context()
    pool = [httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=60, verify=tls)
            for _ in range(clients)]

    async def client(c: httpx.AsyncClient, phase: float) -> None:
        nxt = time.perf_counter() + phase
        while True:
            if pace_s is not None:
                await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
                nxt += pace_s
            if time.perf_counter() >= t_end:
                return
            t0 = time.perf_counter()
            try:
                r = await c.get(path)
                if r.status_code != 200:
                    errors[str(r.status_code)] = errors.get(str(r.status_code), 0) + 1
            except httpx.TransportError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            lat.append(time.perf_counter() - t0)

    t_start = time.perf_counter()
    t_end = t_start + seconds
    try:
        await asyncio.gather(*[client(c, rnd.uniform(0, pace_s or 0)) for c in pool])
    finally:
        for c in pool:
            await c.aclose()
    if not lat:
        raise RuntimeError(f"no request to {path} was answered in {seconds}s")
    elapsed = time.perf_counter() - t_start  # requests in flight at t_end are waited for, and count
    return {"requests": len(lat), "per_s": len(lat) / elapsed, "p50": pctl(lat, 0.5),
            "p99": pctl(lat, 0.99), "max": max(lat), "errors": errors}


def status_load(srv: Server, run: str, a: argparse.Namespace) -> dict[str, Any]:
    path = f"/api/runs/{run}"
    with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=60) as c:
        one = []
        for _ in range(a.single_tries):
            t0 = time.perf_counter()
            c.get(path).raise_for_status()
            one.append(time.perf_counter() - t0)
    sat = asyncio.run(_load(srv, path, a.clients, a.seconds, None, a.seed))
    paced = asyncio.run(_load(srv, path, a.paced_clients, a.seconds, 1.0, a.seed + 1))
    return {"single": one, "saturated": sat, "paced": paced}


def _progress(c: httpx.Client, run: str) -> tuple[str, int, float]:
    st = c.get(f"/api/runs/{run}").raise_for_status().json()
    step = next(s for s in st["steps"] if s["name"] == STEP)
    return step["state"], step["epoch"], step["progress"]["done"] or 0.0


def _cursor_after(probe: Path, epoch: int) -> Callable[[], bool]:
    """True once attempt ``epoch`` restored and stepped past where it started."""
    def moved() -> bool:
        got = pb.started(probe, epoch)
        if not got:
            return False
        return pb.cursor(probe) > got["from"] + 5
    return moved


def pause_tries(srv: Server, run: str, probe: Path, tries: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"api": [], "cli": [], "cli_inner": []}
    with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=180) as c:
        for i in range(2 * tries):
            _, epoch, _ = pb.wait_until(
                lambda: p if (p := _progress(c, run))[0] == "RUNNING" else None, 180, 0.05)
            pb.wait_until(_cursor_after(probe, epoch), 180)
            if (i + i // 2) % 2 == 0:  # api, cli, cli, api, api, cli...: neither side always first
                t0 = time.perf_counter()
                r = c.post(f"/api/runs/{run}/pause", json={"wait": True, "timeout": 120})
                out["api"].append(time.perf_counter() - t0)
                r.raise_for_status()
                if r.json()["state"] != "PAUSED":
                    raise RuntimeError(f"pause through the API answered {r.json()}")
            else:
                t0 = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "segue", "--home", str(srv.home), "pause",
                                       run, "--wait", "--timeout", "120"], env=srv.env,
                                      capture_output=True, text=True, timeout=300)
                out["cli"].append(time.perf_counter() - t0)
                m = re.search(r"PAUSED after ([0-9.]+)s", proc.stdout)
                if proc.returncode != 0 or m is None:
                    raise RuntimeError(f"segue pause --wait exited {proc.returncode}: {proc.stdout}"
                                       f"{proc.stderr}")
                out["cli_inner"].append(float(m.group(1)))
            c.post(f"/api/runs/{run}/resume", json={}).raise_for_status()
    return out


def fill_store(home: Path, n: int) -> float:
    """``n`` more runs of the flow, PENDING, created through the store API; returns seconds."""
    from segue.home import Home
    from segue.run import ops
    from segue.store.base import NewRun

    store = Home.resolve(home).open_store()
    # Set-up, not the figure: this connection skips the fsync at commit (10,000
    # fsynced transactions would take minutes on a slow disk). The server's and
    # the controllers' connections keep synchronous=FULL.
    store._conn().execute("PRAGMA synchronous = OFF")
    proto = ops.prepare_run(FLOW, {"probe_dir": "/nonexistent", "n": 10}, run_id="fill-proto")
    t0 = time.perf_counter()
    for i in range(n):
        store.create_run(NewRun(run_id=f"fill-{i:05d}", flow_name=proto.loaded.flow.name,
                                flow_path=str(proto.loaded.path), params=proto.params,
                                fingerprint=proto.loaded.fingerprint, options=proto.options.to_json()),
                         proto.loaded.order, actor="benchmark")
    store.close()
    return time.perf_counter() - t0


def inprocess_tries(home: Path, pool: Path, run: str, tries: int) -> dict[str, list[float]]:
    """The library calls under the two routes, in this process, without HTTP: a new
    ``LocalClient`` per call, as the server makes one per request."""
    from segue.client.local import LocalClient

    out: dict[str, list[float]] = {"status": [], "page": []}
    LocalClient(home, pool=pool).status(run)  # imports, caches: not what is measured
    for _ in range(tries):
        t0 = time.perf_counter()
        LocalClient(home, pool=pool).status(run)
        out["status"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        LocalClient(home, pool=pool).runs(limit=50)
        out["page"].append(time.perf_counter() - t0)
    return out


def page_tries(srv: Server, tries: int, stored: int) -> dict[str, Any]:
    out: dict[str, Any] = {"first": [], "last": [], "ui": [], "ui_status": None}
    with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=120) as c:
        for _ in range(tries):
            for key, params in (("first", {"limit": 50}), ("last", {"limit": 50, "offset": stored - 50})):
                t0 = time.perf_counter()
                r = c.get("/api/runs", params=params)
                out[key].append(time.perf_counter() - t0)
                r.raise_for_status()
                if len(r.json()) != 50:
                    raise RuntimeError(f"GET /api/runs {params} gave {len(r.json())} runs, not 50")
        r = c.get("/")
        out["ui_status"] = r.status_code
        if r.status_code == 200 and "html" in r.headers.get("content-type", ""):
            for _ in range(tries):
                t0 = time.perf_counter()
                c.get("/").raise_for_status()
                out["ui"].append(time.perf_counter() - t0)
    return out


# -- the report --------------------------------------------------------------------------

def r4(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true")
    mode.add_argument("--smoke", action="store_true", help="a tiny version: checks it runs (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    a.clients = 4 if a.smoke else 16
    a.paced_clients = 5 if a.smoke else 50
    a.seconds = 1.0 if a.smoke else 8.0 if a.quick else 30.0
    a.single_tries = 10 if a.smoke else 100 if a.quick else 300
    a.pause_tries = 1 if a.smoke else 3 if a.quick else 6
    a.runs = 300 if a.smoke else 10_000
    a.page_tries = 2 if a.smoke else 5 if a.quick else 10

    tmp = Path(tempfile.mkdtemp(prefix="segue-bench-server-"))
    pb.private_pool(tmp)  # this process and the server both use tmp/pool.db, never the machine's
    srv = Server(tmp)
    probe = tmp / "probe"
    probe.mkdir()
    notes: list[str] = []
    try:
        srv.start()
        assert srv.proc is not None
        rss_start = proc_status(srv.proc.pid, "VmRSS")
        with httpx.Client(base_url=srv.url, headers=srv.headers, timeout=120) as c:
            r = c.post("/api/runs", json={"flow": str(FLOW), "params": {
                "probe_dir": str(probe), "tick": 0.01, "state_kb": 256, "n": 10**8}})
            r.raise_for_status()
            run = r.json()["run_id"]
            pb.wait_until(lambda: pb.started(probe, 1), 180)
            load = status_load(srv, run, a)
            pauses = pause_tries(srv, run, probe, a.pause_tries)
            c.post(f"/api/runs/{run}/cancel").raise_for_status()
            pb.wait_until(lambda: c.get(f"/api/runs/{run}").json()["state"] == "CANCELLED", 120, 0.05)
        fill_s = fill_store(srv.home, a.runs - 1)
        pages = page_tries(srv, a.page_tries, a.runs)
        floor = inprocess_tries(srv.home, srv.pool, run, a.page_tries)
        rss = proc_status(srv.proc.pid, "VmRSS")
        fds = len(os.listdir(f"/proc/{srv.proc.pid}/fd"))
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    med = statistics.median
    sat, paced = load["saturated"], load["paced"]
    if pages["ui_status"] != 200 or not pages["ui"]:
        notes.append(f"GET / answered {pages['ui_status']}: no web UI page to time (ui_page_10k_s null)")
    out: dict[str, Any] = {
        "requests_per_s": round(sat["per_s"], 1),
        "clients": a.clients,
        "status_p99_saturated_s": r4(sat["p99"]),
        "status_p50_saturated_s": r4(sat["p50"]),
        "status_p99_s": r4(paced["p99"]),
        "status_p50_s": r4(paced["p50"]),
        "paced_clients": a.paced_clients,
        "paced_requests_per_s": round(paced["per_s"], 1),
        "status_p99_1client_s": r4(pctl(load["single"], 0.99)),
        "status_p50_1client_s": r4(med(load["single"])),
        "load_seconds": a.seconds,
        "load_requests": {"saturated": sat["requests"], "paced": paced["requests"],
                          "single": len(load["single"])},
        "load_errors": {"saturated": sat["errors"], "paced": paced["errors"]},
        "runs_page_10k_s": r4(med(pages["first"])),
        "runs_page_10k_max_s": r4(max(pages["first"])),
        "runs_last_page_10k_s": r4(med(pages["last"])),
        "ui_page_10k_s": r4(med(pages["ui"])) if pages["ui"] else None,
        "runs_page_10k_inprocess_s": r4(med(floor["page"])),
        "status_inprocess_s": r4(med(floor["status"])),
        "runs_stored": a.runs,
        "page_tries": a.page_tries,
        "store_fill_s": round(fill_s, 2),
        "pause_to_paused_s": r4(med(pauses["api"])),
        "pause_to_paused_cli_s": r4(med(pauses["cli"])),
        "pause_to_paused_cli_inner_s": r4(med(pauses["cli_inner"])),
        "pause_tries_per_side": a.pause_tries,
        "server_rss_bytes": rss,
        "server_rss_start_bytes": rss_start,
        "server_open_fds": fds,
        "samples": {"pause_api_s": [r4(x) for x in pauses["api"]],
                    "pause_cli_s": [r4(x) for x in pauses["cli"]],
                    "pause_cli_inner_s": [r4(x) for x in pauses["cli_inner"]],
                    "runs_page_10k_s": [r4(x) for x in pages["first"]]},
        "cpus": os.cpu_count(),
        "notes": notes + [
            "the load generator (asyncio + httpx, this process) shares the machine's cpus with "
            "the server; status_p99_s: paced clients once a second each; *_saturated_s: "
            "closed loop, back to back",
            "pause_to_paused_cli_s includes the CLI's start-up (process, imports); "
            "pause_to_paused_cli_inner_s is what the CLI itself reports, without it",
            "*_inprocess_s: LocalClient.status / .runs(limit=50) called in this process, a new "
            "client per call as the server does per request: the floor under the HTTP figures",
            f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus",
        ],
    }
    if a.smoke:
        out["notes"].append(f"--smoke: {a.runs} runs stored, {a.clients} clients for {a.seconds}s; "
                            "figures mean nothing, the run checks the benchmark works")
    out["goals"] = pb.goals(out, GOALS)
    if a.runs != 10_000:  # the page figure is of fewer runs than its goal speaks of
        out["goals"]["runs_page_10k_s"]["met"] = None
    if not a.json:
        for k, v in out.items():
            print(f"{k:>30}: {v}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
