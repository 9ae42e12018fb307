"""A member of a step on Ray: a data step's sub-worker or a gang's rank, on any node.

:class:`MemberActor` (one per member, placed by Ray) starts this module as its
child process, which dials the coordinator back over TCP
(``multiprocessing.connection`` with a per-attempt secret key: only a process
given the key can talk to the coordinator, so nothing unauthenticated is ever
unpickled), says which member it is, receives its recipe and then runs the
ordinary local entry point (``segue.data.subworker.main`` or
``segue.run.gang_rank.main``) over that connection, exactly as a local
sub-worker does over its pipe. It dies with its actor (``PR_SET_PDEATHSIG``),
and the actor with its owner, the step's worker. Its output is read back by
the coordinator (``read_log``) into the attempt's log, as a local sub-worker's
lands there.

A member may be *warmed*: the controller creates a data step's sub-worker
actors together with the attempt's own (executor.ray), and ``warm`` starts
each member process at once, which imports its entry point and then waits on
its stdin for where to dial. The attempt's worker later finds these actors by
name and ``run`` hands each its coordinator's address and key, so the Ray
worker processes and the members' imports start while the attempt's worker
is still starting, not after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Client
from typing import Any

from .local_warm import MEMBER_TARGETS
from .ray_lean import lean_serialization
from .ray_node import (
    LOG_CHUNK,
    _scratch,
    actor_child_environment,
    node_home,
    place_flow,
    signal_child,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class MemberActor:
    """Supervises one member process on its node (declared remote by executor.ray_pool)."""

    def __init__(self) -> None:
        lean_serialization()  # before its first call's arguments are read
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        # The member's output: a file unlinked as soon as it is open, so nothing is
        # left on the node whatever ends this actor; the coordinator reads it back.
        self._out: int | None = None

    def warm(self, *, kind: str, env: dict[str, str], flow: dict[str, bytes], flow_name: str) -> None:
        """Start the member process now; it imports its entry point and waits for
        ``run`` to say where its coordinator listens."""
        with self._lock:
            if self._proc is None:
                self._start(kind, env, flow, flow_name)

    def run(self, *, address: tuple[str, int], key: bytes, index: int, kind: str,
            env: dict[str, str], flow: dict[str, bytes], flow_name: str) -> int:
        """Start the member (unless it was warmed), tell it where to dial, wait for it,
        and return its exit code."""
        with self._lock:
            proc = self._proc or self._start(kind, env, flow, flow_name)
            dial = {"address": f"{address[0]}:{address[1]}", "key": key.hex(), "index": index}
            with contextlib.suppress(OSError):  # it ended already: its exit code says how
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(dial).encode() + b"\n")
                proc.stdin.close()
        return proc.wait()

    def _start(self, kind: str, env: dict[str, str], flow: dict[str, bytes],
               flow_name: str) -> subprocess.Popen[bytes]:
        import ray

        # This actor's own child learns its kind and place from it here (the member's
        # entry point reads them: main, _localise); no controller's setting is among them.
        child_env = actor_child_environment(env)
        child_env.update({"SEGUE_MEMBER_KIND": kind, "SEGUE_MEMBER_PARENT": str(os.getpid()),
                          "SEGUE_MEMBER_NODE": ray.util.get_node_ip_address(),
                          "SEGUE_FLOW_FILE": str(place_flow(flow, flow_name)),
                          "SEGUE_RAY_NODE_ID": ray.get_runtime_context().get_node_id()})
        log = _scratch() / "logs" / f"member-{os.getpid()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w+b") as out:  # (read back by read_log)
            self._out = os.dup(out.fileno())
            log.unlink()
            # Where to dial comes on its stdin (the key never sits in its environment).
            self._proc = subprocess.Popen([sys.executable, "-m", "segue.executor.ray_member"],
                                          stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.PIPE,
                                          env=child_env, start_new_session=True)
        return self._proc

    def read_log(self, offset: int) -> bytes:
        """The member's output from ``offset`` on (at most LOG_CHUNK bytes)."""
        with self._lock:
            return b"" if self._out is None else os.pread(self._out, LOG_CHUNK, offset)

    def signal(self, signum: int) -> None:
        with self._lock:
            proc = self._proc
        signal_child(proc, signum)


def _localise(recipe: Any) -> Any:
    """The recipe as this node sees it: its flow copy, and a home it can reach."""
    changes: dict[str, Any] = {}
    names = {f.name for f in dataclasses.fields(recipe)}
    if "flow_path" in names and recipe.flow_path:
        changes["flow_path"] = os.environ["SEGUE_FLOW_FILE"]
    if "home" in names:
        where = node_home(recipe.home, getattr(recipe, "store", None))
        if isinstance(where, str):
            raise RuntimeError(where)
        changes["home"] = str(where)
    return dataclasses.replace(recipe, **changes) if changes else recipe


def main() -> None:
    """The member process: import its entry point, learn where to dial (one line on
    stdin: the coordinator's address, the attempt's key, its index), dial, get the
    recipe, run the entry point."""
    import importlib

    module, name = MEMBER_TARGETS[os.environ["SEGUE_MEMBER_KIND"]]
    entry = getattr(importlib.import_module(module), name)  # (a warmed member: while it waits)
    line = sys.stdin.buffer.readline()
    if not line:
        return  # its actor ended before it was needed
    dial = json.loads(line)
    host, _, port = dial["address"].rpartition(":")
    conn = Client((host, int(port)), authkey=bytes.fromhex(dial["key"]))
    index = int(dial["index"])
    # Where this member is; a rank 0 also offers the gang's torch.distributed rendezvous.
    conn.send(("hello", index, os.environ["SEGUE_MEMBER_NODE"], _free_port(),
               os.environ["SEGUE_RAY_NODE_ID"]))
    msg = conn.recv()
    if msg[0] != "recipe":
        return
    _, recipe, devices = msg
    try:
        recipe = _localise(recipe)
    except Exception as exc:  # noqa: BLE001 - reported as the member's error, as its entry point does
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    entry(conn, int(os.environ["SEGUE_MEMBER_PARENT"]), index, recipe, devices)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)


def member_options(resources: Any) -> dict[str, Any]:
    """What one member's actor asks Ray for: the step's resources, per member."""
    # run() blocks; signal() and read_log() must still be answered meanwhile.
    opts: dict[str, Any] = {"max_restarts": 0, "max_task_retries": 0, "max_concurrency": 4,
                            "num_cpus": float(getattr(resources, "cpus", 1.0)),
                            "num_gpus": int(getattr(resources, "gpus", 0))}
    memory = getattr(resources, "memory", None)
    if memory:
        opts["memory"] = memory
    accelerator = getattr(resources, "accelerator", None)
    if accelerator and opts["num_gpus"]:
        opts["accelerator_type"] = str(accelerator).upper()
    return opts
