"""Run each attempt on a Ray cluster (``segue run --executor ray [--ray-address ADDR]``).

An attempt is one Ray actor (:class:`~segue.executor.ray_node.AttemptActor`)
placed by Ray on any node with the step's resources; the actor runs the
ordinary worker as its child. Ray's own retries are off (``max_restarts=0``,
``max_task_retries=0``): segue's leases and epochs decide what an attempt's
end means. An actor that dies (its node lost, ``ray.kill``) is an attempt
whose outcome is unknown: the controller records it as killed, and the epoch
settles whatever it may still have committed. Actors are owned by the
controller's Ray driver, so they die with the controller, as local workers do.

Signals become actor calls: pause (SIGUSR1/SIGTERM) and ``ckpt now``
(SIGUSR2) reach the worker through its actor; SIGKILL is ``ray.kill``. The
worker also learns of a pause from its heartbeat, through the store.
The attempt's output streams back into ``HOME/logs`` (``segue logs``) while it
runs; its exit report comes back with its exit code.

A data step's sub-workers and a gang's ranks are actors of their own
(executor.ray_pool); the attempt's actor then holds only its CPUs. A data
step with a fixed number of sub-workers has them *warmed*: their actors are
created with the attempt's, under names derived from it (the worker's options
record names them: executor.ray_attempt), and their processes start importing at once, so
that Ray's worker start-up runs beside the attempt's instead of after it.
The attempt's handle ends them with the attempt.

The cluster's GPUs are one host of segue's device pool (:meth:`RayExecutor.pool_host`),
so Ray runs queue and preempt one another by priority as local runs do: a
preempted run pauses cooperatively, its actor is killed past the pause
deadline, and Ray gives the freed GPU to the urgent run's actor. An elastic
step's allocation there grows and shrinks by sub-worker: stopping the
sub-worker whose GPUs were promised away (a partial preemption) frees them in
Ray.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..flow.model import Resources
from .base import Executor, Launch, PoolHost, WorkerHandle, warm_members
from .ray_lean import lean_if_own

log = logging.getLogger("segue.executor.ray")

LOG_EVERY_S = 0.5  # how often a running attempt's output is fetched
DRAIN_TIMEOUT_S = 30.0
KILL_DRAIN_S = 3.0  # how long a kill waits for the output the worker wrote until then
PROBE_TIMEOUT_S = 5.0
RAY_ENV = "SEGUE_RAY_ENV"  # the names of more variables a worker on Ray gets
# Settings of this host (or of one attempt's member) that mean nothing on another node.
_LOCAL = frozenset({"SEGUE_HOME", "SEGUE_FLOW_FILE", "SEGUE_RAY_NODE_ID"})

# Python's name for "killed by SIGKILL": how a lost actor's attempt is reported.
ACTOR_LOST = -int(signal.SIGKILL)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("the Ray executor needs Ray; install it with pip install 'segue[ray]'") from None
    return ray


def _probe(address: str) -> None:
    """Fail fast on a HOST:PORT nothing listens on (ray.init would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if "://" in address or not sep or not port.isdigit():
        return  # "auto", a ray:// client address: Ray's own checks apply
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise UsageError(f"cannot reach the Ray cluster at {address} ({exc.strerror or exc}); "
                         "start it with `ray start --head` or pass --ray-address HOST:PORT") from None


def connect(address: str) -> Any:
    """Join the Ray cluster at ``address`` ("": $RAY_ADDRESS, else a new local one) once."""
    ray = import_ray()
    if not ray.is_initialized():
        _probe(address)
        lean_if_own()
        # ray.init may install its own SIGINT/SIGTERM handlers: the controller's stay.
        saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ray.init(address=address or None, namespace="segue", log_to_driver=False,
                     include_dashboard=False, configure_logging=False)
        except ConnectionError as exc:
            raise UsageError(f"cannot reach the Ray cluster at {address or '$RAY_ADDRESS'} ({exc}); "
                             "start it with `ray start --head` or pass --ray-address HOST:PORT") from None
        finally:
            for s, h in saved.items():
                if h is not None:
                    signal.signal(s, h)
    return ray


def actor_options(r: Resources, world_size: int = 1) -> dict[str, Any]:
    """What the attempt's actor asks Ray for: the step's resources. A step with
    members (a gang's ranks, a data step's sub-workers) asks for its CPUs only:
    its worker coordinates (barriers, votes, commits) and each member is an actor
    of its own with its own share (executor.ray_pool). Not nothing: a 0-CPU actor
    would land on the head node, whose loss is the cluster's."""
    opts: dict[str, Any] = {
        "num_cpus": r.cpus, "num_gpus": r.gpus,
        "max_restarts": 0, "max_task_retries": 0,
        # run() blocks; signal() and read_log() must still be answered meanwhile.
        "max_concurrency": 4,
    }
    if world_size > 1 or r.workers[1] > 1:
        opts["num_gpus"] = 0
        return opts
    if r.memory:
        opts["memory"] = r.memory
    if r.accelerator and r.gpus:
        opts["accelerator_type"] = r.accelerator.upper()
    return opts


def check_fits(ray: Any, steps: dict[str, tuple[Resources, int]]) -> None:
    """Refuse now a step (or one member of it) that no node of the cluster can hold,
    or whose worker and members together exceed the whole cluster."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    total = {k: sum(n["Resources"].get(k, 0) for n in nodes) for k in ("CPU", "GPU")}
    for name, (r, world) in steps.items():
        members = max(world, r.workers[1]) if world > 1 or r.workers[1] > 1 else 0
        if members:
            noun = "ranks" if world > 1 else "sub-workers"
            need = {"CPU": r.cpus * (1 + members), "GPU": r.gpus * members}
            if any(need[k] > total[k] for k in need):
                raise UsageError(
                    f"step {name!r} needs {need['CPU']:g} CPUs and {need['GPU']:g} GPUs on Ray in all "
                    f"(its worker and {members} {noun}, {r.cpus:g} CPUs each), but the cluster has "
                    f"{total['CPU']:g} CPUs and {total['GPU']:g} GPUs; add nodes or declare fewer")
        want = {"CPU": r.cpus, "GPU": r.gpus}  # the step's process, or each of its members
        # (a step with members also needs its coordinator's CPUs, on any node)
        if any(all(n["Resources"].get(k, 0) >= v for k, v in want.items() if v) for n in nodes):
            continue
        most = max((n["Resources"].get("CPU", 0), n["Resources"].get("GPU", 0)) for n in nodes) \
            if nodes else (0, 0)
        raise UsageError(
            f"step {name!r} needs {want['CPU']:g} CPUs and {want['GPU']:g} GPUs on one Ray node, "
            f"but the largest node of the cluster has {most[0]:g} CPUs and {most[1]:g} GPUs; "
            "add a node that large or declare less")


def cluster_pool_host(ray: Any) -> PoolHost:
    """The cluster as one host of segue's device pool: named by its GCS address (every
    controller that reaches the cluster, by any spelling of its address, names it
    alike), with a device per whole GPU of its live nodes, named by the node's
    accelerator type when Ray knows it. Ray chooses the physical GPU; the pool
    decides who may hold how many of which type."""
    devices: list[tuple[str, int, bool]] = []
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
    for node in nodes:
        res = node["Resources"]
        kind = next((k.partition(":")[2] for k in res if k.startswith("accelerator_type:")), "")
        devices += [(kind or "ray-gpu", 0, False)] * int(res.get("GPU", 0))
    return PoolHost(host=f"ray:{ray.get_runtime_context().gcs_address}",
                    cpus=max(1.0, sum(n["Resources"].get("CPU", 0) for n in nodes)),
                    memory=int(sum(n["Resources"].get("memory", 0) for n in nodes)),
                    devices=devices, source="ray")


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """What of the controller's environment a worker on a Ray node gets.

    Not all of it (PATH, HOME and the like are the node's own, and secrets
    should not spread to every node unasked): segue's own ``SEGUE_*``
    settings, and the variables ``$SEGUE_RAY_ENV`` names (comma-separated).
    """
    env = os.environ if environ is None else environ
    names = {n.strip() for n in env.get(RAY_ENV, "").split(",") if n.strip()}
    return {k: v for k, v in env.items() if k in names or (k.startswith("SEGUE_") and k not in _LOCAL)}


def actor_name(home: str | Path, run_id: str, step: str, epoch: int) -> str:
    """The attempt's actor's name in the "segue" namespace, unique per home, run,
    step and epoch: how another process (``segue ckpt now``) reaches it."""
    import hashlib

    key = hashlib.sha256(str(Path(home).resolve()).encode()).hexdigest()[:12]
    return f"segue-{key}-{run_id}-{step}-e{epoch}"


def signal_attempt(address: str, home: str | Path, run_id: str, step: str, epoch: int,
                   sig: signal.Signals) -> bool:
    """Signal a running attempt's worker through its actor; False if it is not running."""
    ray = connect(address)
    try:
        actor = ray.get_actor(actor_name(home, run_id, step, epoch), namespace="segue")
    except ValueError:  # no such actor (any more)
        return False
    return bool(ray.get(actor.signal.remote(int(sig)), timeout=30))


class RayHandle(WorkerHandle):
    """A started attempt on Ray: polls the actor's ``run`` and streams its output home."""

    def __init__(self, ray: Any, actor: Any, ref: Any, spec: Launch, members: list[Any] | None = None) -> None:
        self.pid = None  # the worker records its own pid and host in the store
        self._ray, self._actor, self._ref, self._spec = ray, actor, ref, spec
        self._members = members or []  # warmed sub-worker actors: they end with the attempt
        self._offset = 0
        self._pending: Any = None  # an outstanding read_log call
        self._next_read = 0.0
        self._code: int | None = None
        self._killed = False
        self._placed: Any = actor.node.remote()  # answers once Ray placed the actor on a node

    def waiting(self) -> bool:
        """True while Ray has not placed the actor yet (the cluster is busy)."""
        if self._placed is not None and self._code is None:
            ready, _ = self._ray.wait([self._placed], timeout=0)
            if not ready:
                return True
            self._placed = None
        return False

    # -- output ------------------------------------------------------------------
    def _append(self, chunk: bytes) -> None:
        if chunk:
            with open(self._spec.log_path, "ab") as f:
                f.write(chunk)
            self._offset += len(chunk)

    def _stream(self) -> None:
        if self._pending is not None:
            ready, _ = self._ray.wait([self._pending], timeout=0)
            if not ready:
                return
            try:
                self._append(self._ray.get(self._pending))
            except Exception:  # the actor is gone: poll() reports that
                pass
            self._pending = None
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + LOG_EVERY_S
            self._pending = self._actor.read_log.remote(self._offset)

    def _drain(self, timeout: float = DRAIN_TIMEOUT_S) -> None:
        """Fetch what is left of the output: once the worker ended, or before its actor
        is killed (what the worker wrote until then would go with the actor)."""
        from .ray_node import drain_log

        pending, self._pending = self._pending, None
        with contextlib.suppress(Exception):  # a lost actor's output is lost with its node
            if drain_log(self._ray, self._actor, self._offset, pending, timeout, self._append):
                self._ray.get(self._actor.discard_log.remote(), timeout=timeout)

    def _end_members(self) -> None:
        for m in self._members:
            with contextlib.suppress(Exception):
                self._ray.kill(m, no_restart=True)
        self._members = []

    # -- WorkerHandle -----------------------------------------------------------------
    def poll(self) -> int | None:
        if self._code is not None:
            return self._code
        ready, _ = self._ray.wait([self._ref], timeout=0)
        if not ready:
            self._stream()
            return None
        try:
            outcome = self._ray.get(self._ref)
        except Exception as exc:  # RayActorError and kin: the outcome is unknown
            self._code = ACTOR_LOST
            self._end_members()
            if not self._killed:
                why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self._report({"error": f"the Ray actor of this attempt died ({type(exc).__name__}: "
                                       f"{why[:300]}); its node may be lost", "retryable": True})
                self._append(f"segue: the Ray actor of this attempt died: {type(exc).__name__}\n".encode())
            return self._code
        self._drain()
        if outcome.get("report"):
            self._report(outcome["report"])
        self._code = int(outcome["code"])
        self._ray.kill(self._actor)  # its resources go back to the cluster now
        self._end_members()
        return self._code

    def _report(self, doc: dict[str, Any]) -> None:
        """Hand the exit report to the controller where a local worker leaves it."""
        from ..executor.exits import exit_report_path, write_exit_report
        from ..home import Home

        write_exit_report(exit_report_path(Home(Path(self._spec.home)), self._spec.run_id,
                                           self._spec.step, self._spec.epoch), doc)

    def signal(self, sig: signal.Signals) -> None:
        if self._code is not None:
            return
        if sig == signal.SIGKILL:
            self._killed = True
            self._drain(KILL_DRAIN_S)  # a lost node's actor answers at once: with an error
            with contextlib.suppress(Exception):
                self._ray.kill(self._actor, no_restart=True)
            self._end_members()
            return
        self._actor.signal.remote(int(sig))  # fire and forget, as os.kill is


class RayExecutor(Executor):
    """Attempts as Ray actors on the cluster at ``address`` ("": $RAY_ADDRESS or a local one)."""

    def __init__(self, address: str = "") -> None:
        self.address = address
        self._actor_cls: Any = None
        self._member_cls: Any = None

    def pool_host(self) -> PoolHost:
        return cluster_pool_host(connect(self.address))

    def _remote(self) -> Any:
        if self._actor_cls is None:
            ray = connect(self.address)
            from .ray_node import AttemptActor

            self._actor_cls = ray.remote(AttemptActor)
        return self._actor_cls

    def launch(self, spec: Launch) -> RayHandle:
        cls = self._remote()
        ray = import_ray()
        # The user's settings and the variables other tools need (Ray picks the GPUs);
        # what the controller tells the worker travels in its options record, which
        # names the store: a node that does not see the home still reaches it.
        env = {**forwarded_env(), **{k: v for k, v in spec.env.items() if k != "CUDA_VISIBLE_DEVICES"}}
        from .ray_node import flow_bundle

        bundle = flow_bundle(spec.flow_path)
        name = actor_name(spec.home, spec.run_id, spec.step, spec.epoch)
        warm = [member_name(name, i) for i in range(warm_members(spec))]
        member_env = forwarded_env(env)
        opts = actor_options(spec.resources, spec.world_size)
        opts.update(name=name, namespace="segue")
        actor = cls.options(**opts).remote()
        ref = actor.run.remote(home=str(spec.home), run_id=spec.run_id, step=spec.step,
                               epoch=spec.epoch, env=env, flow=bundle,
                               flow_name=Path(spec.flow_path).name, options=spec.options, warm=warm)
        # After the attempt's own actor, so that Ray starts its process first.
        members = [self._warm(spec, n, member_env, bundle) for n in warm]
        log.info("attempt %s epoch %d submitted to Ray (%s; %d warmed sub-workers)", spec.step, spec.epoch,
                 {k: v for k, v in opts.items() if k.startswith("num_")}, len(members))
        return RayHandle(ray, actor, ref, spec, members)

    def _warm(self, spec: Launch, name: str, env: dict[str, str], bundle: dict[str, bytes]) -> Any:
        """Create one sub-worker's actor and start its process now."""
        from .ray_member import MemberActor, member_options

        if self._member_cls is None:
            self._member_cls = import_ray().remote(MemberActor)
        actor = self._member_cls.options(**member_options(spec.resources), name=name,
                                         namespace="segue").remote()
        actor.warm.remote(kind="sub-worker", env=env, flow=bundle, flow_name=Path(spec.flow_path).name)
        return actor


def member_name(attempt: str, index: int) -> str:
    """The name of an attempt's warmed sub-worker ``index`` in the "segue" namespace."""
    return f"{attempt}-m{index}"
