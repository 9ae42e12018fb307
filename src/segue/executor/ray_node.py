"""The node side of the Ray executor: one actor per attempt supervises its worker.

The actor is a thin supervisor on whichever Ray node holds the step's
resources. It runs the ordinary worker (``python -m segue._worker_main``) as
its own child, so everything a worker does locally still holds there: Unix
signals for pause and ``ckpt now``, ``PR_SET_PDEATHSIG`` (the worker dies with
the actor, which Ray kills with its owner, the controller), the exit codes.
What a local executor gets through the filesystem comes back through actor
calls instead: the flow's source arrives by content, the attempt's output is
read back in chunks (``read_log``), and the exit report is returned with the
exit code. Nothing here assumes the controller's disk.

Kept apart from :mod:`segue.executor.ray` so a Ray worker process imports
only what it needs (no controller, no store).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .ray_lean import lean_serialization

# What an attempt returns: its exit code and, when it wrote one, its exit report.
Outcome = dict[str, Any]

LOG_CHUNK = 1 << 20  # bytes per read_log call
BUNDLE_FILES, BUNDLE_BYTES = 200, 8 << 20  # at most this much code travels with a flow


def _scratch() -> Path:
    """A directory of this node for the flows and logs of attempts (not the controller's)."""
    root = Path(tempfile.gettempdir()) / f"segue-ray-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def flow_bundle(path: str | Path) -> dict[str, bytes]:
    """The flow file and the Python modules beside it (which it may import), by name.

    What travels to a Ray node: the code by content, never a path the node may
    not have. Only the flow's own directory, not below it, and only while it is
    small; a larger code base belongs in an installed package on every node.
    """
    flow = Path(path)
    bundle = {flow.name: flow.read_bytes()}
    size = len(bundle[flow.name])
    for p in sorted(flow.parent.glob("*.py")):
        if p.name == flow.name or not p.is_file():
            continue
        with contextlib.suppress(OSError):
            data = p.read_bytes()
            if len(bundle) >= BUNDLE_FILES or size + len(data) > BUNDLE_BYTES:
                break
            bundle[p.name] = data
            size += len(data)
    return bundle


def place_flow(bundle: dict[str, bytes], name: str) -> Path:
    """Write the flow's bundle under its content hash (atomically) and return the flow's path.

    The file keeps its original name: the flow's module name and its
    sub-workers' recipes derive from the path, which is the same for the same
    content on every node.
    """
    h = hashlib.sha256()
    for n in sorted(bundle):
        h.update(n.encode() + b"\0" + hashlib.sha256(bundle[n]).digest())
    d = _scratch() / "flows" / h.hexdigest()[:24]
    d.mkdir(parents=True, exist_ok=True)
    for n, data in bundle.items():
        path = d / Path(n).name
        if not path.exists() or path.read_bytes() != data:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
    return d / (Path(name).name or "flow.py")


def child_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment of a process this node starts for segue: the node's own, but
    segue's settings only as the controller sent them (a ``SEGUE_STORE`` that the
    node's Ray happened to start with must not point a run at another store)."""
    ambient = {k: v for k, v in os.environ.items() if not k.startswith("SEGUE_")}
    return {**ambient, **env}


def actor_child_environment(env: dict[str, str]) -> dict[str, str]:
    """The environment of the process an actor starts (a worker, a member): the
    user's settings the controller forwarded (:func:`child_environment`) and exactly
    the devices Ray gave the actor. What segue tells the process comes another way
    (a worker: its options record on stdin)."""
    import ray

    gpus = ",".join(str(g) for g in ray.get_gpu_ids())
    return {**child_environment(env), "CUDA_VISIBLE_DEVICES": gpus, "PYTHONUNBUFFERED": "1"}


def signal_child(proc: subprocess.Popen[bytes] | None, signum: int) -> bool:
    """Deliver ``signum`` to an actor's child; False once it ended (or before it started)."""
    if proc is None or proc.poll() is not None:
        return False
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.Signals(signum))
    return True


def drain_log(ray: Any, actor: Any, offset: int, pending: Any, timeout: float,
              take: Callable[[bytes], None]) -> bool:
    """Read an actor's output (``read_log``) from ``offset`` to its end into ``take``,
    an outstanding read (``pending``) first, within ``timeout`` in all; True once the
    end was reached. A lost actor raises, as ``ray.get`` does."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.01, deadline - time.monotonic())

    if pending is not None:
        chunk = bytes(ray.get(pending, timeout=left()))
        offset += len(chunk)
        take(chunk)
    while time.monotonic() < deadline:
        chunk = bytes(ray.get(actor.read_log.remote(offset), timeout=left()))
        if not chunk:
            return True
        offset += len(chunk)
        take(chunk)
    return False


def node_home(home: str, store: str | None) -> Path | str:
    """The segue home a worker on this node uses, or one line on why there is none.

    With a PostgreSQL store (``store``: the controller's record names it), a home of
    this node's own: it then holds only the worker's scratch (its exit report),
    the store is reached by URL and checkpoints go where the run's
    --checkpoints URL says (required at submit). A directory at the controller's
    path on this node may be another machine's home: it is never used then.
    With SQLite, the controller's home itself, which the node must see (one
    machine, or a filesystem every node mounts at the same path).
    """
    from ..store import DB_NAME

    root = Path(home)
    if not store:
        if (root / DB_NAME).exists():
            return root
        return (f"Ray node cannot see segue home {home} and the run's store is SQLite there; "
                "on a Ray cluster use a PostgreSQL store (--store) and --checkpoints URL on "
                "shared storage, or a filesystem every node mounts at the same path")
    local = _scratch() / "homes" / hashlib.sha256(home.encode()).hexdigest()[:16]
    local.mkdir(parents=True, exist_ok=True)
    return local


class AttemptActor:
    """One attempt of one step on a Ray node (declared remote by :mod:`segue.executor.ray`)."""

    def __init__(self) -> None:
        lean_serialization()  # before its first call's arguments are read
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: Path | None = None
        self._lock = threading.Lock()
        self._raylet = os.getppid()  # Ray starts its workers from the node's raylet

    def node(self) -> dict[str, Any]:
        """Where this actor runs: the Ray node, the pid, the devices Ray gave it."""
        import ray

        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "pid": os.getpid(),
                "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def run(self, *, home: str, run_id: str, step: str, epoch: int, env: dict[str, str],
            flow: dict[str, bytes], flow_name: str, options: dict[str, Any] | None = None,
            warm: list[str] | None = None) -> Outcome:
        """Start the worker, hand it the controller's options record with what this node
        adds (``"ray"``: executor.ray_attempt; ``warm``: the attempt's warmed sub-worker
        actors), wait for it, and return its exit code and report."""
        import ray

        from ..executor.exits import exit_report_path
        from ..home import Home
        from .local import write_options
        from .ray_attempt import RayAttempt

        record = dict(options or {})
        where = node_home(home, record.get("store"))
        if isinstance(where, str):  # this node cannot reach the run's store
            return {"code": 1, "report": {"error": where, "traceback": "", "retryable": False}}
        home = str(where)
        log_dir = _scratch() / "logs" / run_id
        log_dir.mkdir(parents=True, exist_ok=True)
        # Its own file (a run id and epoch may recur across homes and sessions).
        self._log = log_dir / f"{step}.e{epoch}.{uuid.uuid4().hex[:12]}.log"
        child_env = actor_child_environment(env)
        ctx = ray.get_runtime_context()
        # The worker's members (sub-workers, ranks) become actors of this cluster.
        facts = RayAttempt(address=ctx.gcs_address, node_id=ctx.get_node_id(),
                           flow_file=str(place_flow(flow, flow_name)),
                           gpus=tuple(int(g) for g in ray.get_gpu_ids()), warm=tuple(warm or ()))
        record["ray"] = facts.to_json()
        cmd = [sys.executable, "-m", "segue._worker_main", "--home", home, "--run", run_id,
               "--step", step, "--epoch", str(epoch), "--parent-pid", str(os.getpid()), "--options-stdin"]
        with open(self._log, "wb") as out:
            out.write(f"segue: attempt epoch {epoch} on Ray node {facts.node_id} "
                      f"(actor pid {os.getpid()}, devices [{child_env['CUDA_VISIBLE_DEVICES']}])\n".encode())
            out.flush()
            with self._lock:
                self._proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.PIPE, env=child_env,
                                              start_new_session=True)
                write_options(self._proc, record)
        code = self._proc.wait()
        report = None
        path = exit_report_path(Home.resolve(home), run_id, step, epoch)
        with contextlib.suppress(OSError, ValueError):
            report = json.loads(path.read_text())
        if report is None and code == -signal.SIGKILL and self._raylet_gone():
            # The node is going down and took the worker first; this actor may still
            # answer before it goes too. Say so, as the actor's own death would.
            report = {"error": "the Ray actor of this attempt died with its node (the node's raylet "
                               "ended and the worker was killed); its node is lost",
                      "traceback": "", "retryable": True}
        return {"code": code, "report": report}

    def _raylet_gone(self, wait_s: float = 1.0) -> bool:
        """Whether this node's raylet ended (this process was reparented), waiting up to
        ``wait_s`` for it: a worker SIGKILLed on a healthy node is the rare case."""
        deadline = time.monotonic() + wait_s
        while os.getppid() == self._raylet:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def signal(self, signum: int) -> bool:
        """Deliver a signal to the worker; False once it ended (or before it started)."""
        with self._lock:
            proc = self._proc
        return signal_child(proc, signum)

    def discard_log(self) -> None:
        """Remove this node's copy of the output once the controller has all of it."""
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.unlink()

    def read_log(self, offset: int) -> bytes:
        """The attempt's output from ``offset`` on (at most LOG_CHUNK bytes)."""
        if self._log is None:
            return b""
        try:
            with open(self._log, "rb") as f:
                f.seek(offset)
                return f.read(LOG_CHUNK)
        except OSError:
            return b""
