"""``LocalClient``: the client contract over a home directory (no server needed).

It is the library under the CLI: the CLI parses arguments, calls these
methods and prints what they return. Every option a run needs is passed
explicitly (to the store, to the controllers it spawns), never through
environment variables.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import NotFoundError, SegueError, UsageError, WaitTimeoutError
from ..flow import LoadedFlow, load_flow, parse_duration
from ..home import Home
from ..hostname import this_host
from ..placement.policy import parse_priority
from ..placement.pricing import Prices
from ..run import environment as run_env
from ..run import ops
from ..run.options import RunOptions
from ..run.resume_inputs import check_decisions, check_inputs
from ..states import Actor, RunState
from ..store.base import RunRecord, Store, TaskRecord
from ..store.pool import HostPool, HostPoolStore
from ..units import parse_bytes
from .base import RESTING, BaseClient, check_changes_limit
from .records import (
    CheckpointRecord,
    DeviceView,
    Event,
    MetricPoint,
    PoolChange,
    PoolView,
    QueueEntry,
    RunStatus,
    RunSummary,
)


def _states(state: str | RunState | Collection[str | RunState] | None) -> set[RunState] | None:
    if state is None:
        return None
    items = [state] if isinstance(state, str | RunState) else list(state)
    out = set()
    for s in items:
        try:
            out.add(RunState(str(getattr(s, "value", s)).upper()))
        except ValueError:
            raise UsageError(f"unknown run state {s!r}; one of "
                             f"{', '.join(x.value for x in RunState)}") from None
    return out


class LocalClient(BaseClient):
    """Drive the runs of one home.

    ``home``: the home directory (default ``$SEGUE_HOME`` or ``./.segue``).
    ``store``: the home's metadata store, a ``postgresql://`` URL (default
    ``$SEGUE_STORE``, else the home's ``config.json``, else SQLite in the home);
    controllers started by this client, and their workers, are told the same one.
    ``pool``: the host's device pool database (default ``$SEGUE_POOL``, see the
    README); controllers started by this client use the same one. ``actor``:
    who the events name as the cause of each change (``"api:alice"`` for a
    server's principal, ``"cli"`` for the command line).
    """

    def __init__(self, home: str | os.PathLike[str] | Home | None = None, *,
                 store: str | None = None, pool: str | os.PathLike[str] | None = None,
                 actor: str = Actor.API, prices: Mapping[str, float] | None = None) -> None:
        from ..store import check_store_url
        from ..store.hostpool import pool_path
        from ..store.postgres import is_postgres_url

        if store is not None:
            store = check_store_url(store, "store")
        if isinstance(home, Home):
            self.home = home if store is None else dataclasses.replace(home, store=store)
        else:
            self.home = Home.resolve(home, store=store)
        self.pool_path: Path | str = (
            pool if isinstance(pool, str) and is_postgres_url(pool)
            else Path(pool).expanduser().resolve() if pool is not None
            else pool_path(self.home.root, store=self.home.store))
        self.actor = actor
        self._prices = dict(prices or {})
        self._store: Store | None = None
        self._pool: Any = None
        self._parent: LocalClient | None = None  # whose connections this one shares
        self._loaded: dict[str, LoadedFlow] = {}  # flows this client loaded, by run

    def acting_as(self, actor: str) -> LocalClient:
        """A client of the same home and pool whose events name ``actor``. It shares this
        client's store and pool connections (a server makes one per request)."""
        other = LocalClient(self.home, pool=self.pool_path, actor=actor, prices=self._prices)
        other._parent = self  # opens nothing now: a home is never created by reading it
        return other

    # -- plumbing ---------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The home's store (created on first use of a command that writes)."""
        if self._store is None:
            self._store = self._parent.store if self._parent is not None else self.home.open_store()
        return self._store

    def _reading(self) -> Store:
        ops.require_home(self.home)  # reading never creates a home
        return self.store

    @property
    def pool_home(self) -> str:
        """How the pool names this home's runs (its path; a cluster's id on PostgreSQL)."""
        from ..store.hostpool import home_key

        return home_key(self.home.root, self.store if self.home.exists() else None)

    def _open_pool(self) -> Any:
        if self._pool is None:
            from ..store.pools import open_pool

            self._pool = (self._parent._open_pool() if self._parent is not None
                          else open_pool(self.pool_path, store=self._store))  # shares an open store's connections
        return self._pool

    # -- commands ---------------------------------------------------------------------

    def prepare(
        self, flow: str, params: Mapping[str, Any] | None = None, *, run_id: str | None = None,
        priority: str | int | None = None, gpus: int | None = None, gpu_memory: str | int | None = None,
        preemptible: bool | None = None, max_pause: str | float | None = None,
        pause_deadline_s: float | None = None, pause_on_failure: bool | None = None,
        on_input_change: str | None = None, options: Mapping[str, Any] | None = None,
        checkpoints: str | None = None, executor: str | None = None, ray_address: str | None = None,
        on_env_change: str | None = None,
    ) -> RunSummary:
        """Validate and create the run (PENDING) without starting a controller;
        :meth:`drive` runs it in this process (the CLI's foreground `segue run`).

        ``checkpoints``: where the run keeps its checkpoints and step outputs (an
        absolute path or an fsspec URL such as s3://bucket/prefix; default the home's
        data directory); refused now if it cannot be written. ``executor``: "local"
        (default) or "ray", with ``ray_address`` the cluster (segue.executor.ray)."""
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
            raise UsageError(f"gpus must be an integer >= 0, not {gpus!r}")
        opts = RunOptions.from_json(dict(options or {})).with_changes(  # None: keep what is there
            on_input_change=on_input_change, pause_deadline_s=pause_deadline_s,
            pause_on_failure=pause_on_failure, preemptible=preemptible, gpus=gpus,
            priority=None if priority is None else parse_priority(priority),
            gpu_memory=None if gpu_memory is None else parse_bytes(gpu_memory, "gpu_memory",
                                                                   error=UsageError),
            max_pause_s=None if max_pause is None else parse_duration(max_pause, "max_pause"),
            checkpoints=checkpoints, executor=executor, ray_address=ray_address, on_env_change=on_env_change,
        )
        if opts.executor == "ray" and not opts.checkpoints and self.home.store_url():
            # Ray nodes then keep homes of their own: the home's data directory is no one's.
            raise UsageError("on Ray with a PostgreSQL store the nodes do not share this home; pass "
                             "--checkpoints URL (e.g. s3://bucket/prefix) on storage every node reads")
        # Strings are converted by the flow's declared types (as on the command line),
        # typed values are checked against them: flow.params.resolve does both.
        prepared = ops.prepare_run(flow, dict(params or {}), run_id=run_id, options=opts, pool=self._open_pool)
        env = run_env.capture(tuple(prepared.loaded.flow.env), prepared.loaded.path)  # (run.environment)
        run = ops.create_run(self.store, prepared, actor=self.actor)
        run_env.record_submit(self.store, run.run_id, env, actor=self.actor)
        self._loaded[run.run_id] = prepared.loaded
        return self._summary(run)

    def submit(self, flow: str, params: Mapping[str, Any] | None = None, **kw: Any) -> RunSummary:
        """See :meth:`BaseClient.submit`; returns once a controller drives the run."""
        summary = self.prepare(flow, params, **kw)
        return self._started(summary.run_id)

    def start(self, run: str, *, allow_code_change: bool = False) -> int:
        """Start a background controller for the run; returns its pid."""
        return ops.spawn_detached(self.home, run, allow_code_change=allow_code_change, pool=self.pool_path)

    def _started(self, run: str, *, allow_code_change: bool = False, timeout_s: float = 60.0) -> RunSummary:
        """Start a controller and return once it holds the run (its epoch rose) and
        moved it, so the caller never sees the state from before the start (PENDING,
        PAUSED); or once the controller is gone (it may have finished the run)."""
        from .._procs import pid_alive

        first = self.store.get_run(run)
        pid = self.start(run, allow_code_change=allow_code_change)
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.store.get_run(run)
            if record.controller_epoch > first.controller_epoch and record.state != first.state:
                return self._summary(record)
            if not pid_alive(pid):
                before = first.controller_epoch
                record = self.store.get_run(run)
                if record.controller_epoch > before:
                    return self._summary(record)
                raise SegueError(f"the controller of run {run!r} exited before it took the run: "
                                 f"{self._last_line(run)}; see {self.home.logs_dir(run) / 'controller.log'}")
            if time.monotonic() > deadline:  # a loaded machine: the controller is still starting
                return self._summary(record)
            time.sleep(0.02)

    def _last_line(self, run: str) -> str:
        try:
            lines = (self.home.logs_dir(run) / "controller.log").read_text(errors="replace").splitlines()
        except OSError:
            return "no log"
        return next((x.strip() for x in reversed(lines) if x.strip()), "no output")

    def drive(self, run: str, *, reason: str, on_tick: Callable[[RunRecord, list[TaskRecord]], None] | None = None,
              interrupts: Any = None) -> RunState:
        """Run the run's controller in this process until the run rests; returns its state."""
        record = self.store.get_run(run)
        loaded = self._loaded.pop(run, None) or load_flow(record.flow_path)
        ctl = ops.make_controller(self.home, self.store, record, loaded, actor=self.actor,
                                  on_tick=on_tick, interrupts=interrupts, pool=self.pool_path)
        return ops.drive(ctl, reason=reason)

    def pause(self, run: str, *, wait: bool = False, timeout: float | None = None) -> RunSummary:
        record = ops.request_pause(self._reading(), run, actor=self.actor)
        return self.wait(run, RESTING, timeout) if wait else self._summary(record)

    def wait(self, run: str, states: Collection[str | RunState] = RESTING, timeout: float | None = None,
             poll_s: float = 0.05) -> RunSummary:
        """See :meth:`BaseClient.wait`; here a pause whose controller is gone is settled
        while waiting (``ops.wait_for_state``), as `segue pause --wait` does."""
        want = _states(list(states)) or set()
        record = ops.wait_for_state(self._reading(), run, want, timeout, poll_s, actor=self.actor)
        if record.state not in want:
            raise WaitTimeoutError(run, record.state, sorted(s.value for s in want), timeout or 0.0)
        return self._summary(record)

    def prepare_resume(self, run: str, *, allow_code_change: bool = False, restart_step: str | None = None,
                       on_input_change: str | None = None, on_env_change: str | None = None) -> RunSummary:
        """Check and store the resume choices without starting a controller (see :meth:`drive`)."""
        store = self._reading()
        record = ops.check_resumable(store, run)
        loaded = load_flow(record.flow_path)
        ops.check_code(record, loaded, allow_code_change)
        ops.check_no_live_controller(record, store.now())
        # A data step's changed input is refused here (exit 2), not at its start.
        check_inputs(self.home, store, record, loaded, on_input_change=on_input_change, skip=restart_step)
        # So is a fan-out or a branch whose files changed since it was decided (run/paths.py).
        kept = check_decisions(self.home, store, record, loaded, on_input_change=on_input_change,
                               restart=restart_step)
        # A changed distribution a step imported, or a declared variable: refused here too.
        env = run_env.check_resume(
            store, record, tuple(loaded.flow.env), loaded.path, skip=restart_step,
            policy=RunOptions.from_json(record.options).with_changes(on_env_change=on_env_change).on_env_change)
        record = ops.apply_resume_choices(store, record, restart_step=restart_step,
                                          on_input_change=on_input_change, actor=self.actor,
                                          on_env_change=on_env_change, flow=loaded.flow.steps)
        ops.clear_preemption(store, record.run_id)  # the operator resumes it now, not the scheduler
        # The controller makes the transition; this event says who asked for it.
        store.append_event(run, "command", actor=self.actor, reason="resume requested",
                           data={"command": "resume", "restart_step": restart_step})
        run_env.record_resume(store, run, env, actor=self.actor)  # if it changed: the new baseline
        for line in kept:
            store.append_event(run, "warning", actor=self.actor, reason=line, data={"kind": "path-kept"})
        self._loaded[run] = loaded
        return self._summary(record)

    def resume(self, run: str, *, allow_code_change: bool = False, restart_step: str | None = None,
               on_input_change: str | None = None, on_env_change: str | None = None) -> RunSummary:
        """See :meth:`BaseClient.resume`; returns once a controller drives the run."""
        self.prepare_resume(run, allow_code_change=allow_code_change, restart_step=restart_step,
                            on_input_change=on_input_change, on_env_change=on_env_change)
        self._loaded.pop(run, None)
        return self._started(run, allow_code_change=allow_code_change)

    def cancel(self, run: str) -> RunSummary:
        return self._summary(ops.cancel(self._reading(), run, actor=self.actor))

    def checkpoint_now(self, run: str) -> list[str]:
        return ops.checkpoint_now(self.home, self._reading(), run, actor=self.actor)

    # -- reading ----------------------------------------------------------------------

    def status(self, run: str, *, prices: Mapping[str, float] | None = None, items: bool = False) -> RunStatus:
        """See :meth:`BaseClient.status`; ``prices``: USD per hour by key for this
        reading (over the home's and the built-in ones, see `segue prices`); ``items``:
        list every task of a fan-out or a loop (by default only those not done)."""
        from ..errors import StoreError
        from ..run.status import run_status

        prices_now = Prices.resolve(self.home.root, {**self._prices, **(prices or {})})
        try:  # the pool counts the attempts running now; status still works without one
            pool = self._open_pool()
        except StoreError:
            pool = None
        doc = run_status(self._reading(), run, prices_now, pool=pool, home_key=self.pool_home, items=items)
        return RunStatus.from_json(doc)

    def environment(self, run: str) -> dict[str, Any]:
        """The run's recorded environment, what its steps imported, and the diff to this
        process's environment now (`segue env RUN`; segue.run.environment.report)."""
        store = self._reading()
        return run_env.report(store, store.get_run(run))

    def summary(self, run: str) -> RunSummary:
        return self._summary(self._reading().get_run(run))

    def _summary(self, r: RunRecord, shown: str | None = None) -> RunSummary:
        return RunSummary(run_id=r.run_id, state=r.state, shown=shown or r.state.value,
                          priority=int(r.options.get("priority", 100)), flow=r.flow_name,
                          created_at=r.created_at, updated_at=r.updated_at)

    def runs(self, *, state: str | RunState | Collection[str | RunState] | None = None,
             flow: str | None = None, limit: int | None = None, offset: int = 0) -> list[RunSummary]:
        from ..scheduler.views import display_states

        want = _states(state)
        if limit is not None and limit < 0 or offset < 0:
            raise UsageError("limit and offset must be >= 0")
        if not self.home.exists():
            return []
        store = self.store
        rows = store.list_runs(states=want, flow=flow, limit=limit, offset=offset)
        shown = display_states(store, rows)
        return [self._summary(r, shown[r.run_id]) for r in rows]

    def events(self, run: str, *, after: int = 0, follow: bool = False,
               poll_s: float = 0.1) -> Iterator[Event]:
        store = self._reading()
        store.get_run(run)  # an unknown run is an error, now, not at the first next()
        return self._events(store, run, after, follow, poll_s)

    def _events(self, store: Store, run: str, after: int, follow: bool, poll_s: float) -> Iterator[Event]:
        while True:
            batch = store.list_events(run, after_id=after)
            yield from batch
            if batch:
                after = batch[-1].id
            if not follow:
                return
            record = store.get_run(run)
            if record.state in RESTING or (record.state != RunState.PENDING
                                           and not record.controller_alive(store.now())):
                # One more read: what was committed with the last state change.
                yield from store.list_events(run, after_id=after)
                return
            time.sleep(poll_s)

    def checkpoints(self, run: str) -> list[CheckpointRecord]:
        store = self._reading()
        store.get_run(run)
        return store.list_checkpoints(run, statuses=("committed", "quarantined", "pruned"))

    def metrics(self, run: str, step: str | None = None, *,
                since: float | None = None) -> list[MetricPoint]:
        store = self._reading()
        if step is not None:
            from ..run.logs import check_step

            steps = [t.step for t in store.get_tasks(run)]
            if check_step(step) not in steps:
                raise NotFoundError(f"run {run!r} has no step {step!r}; its steps: {', '.join(steps)}")
        return store.get_metrics(run, step, since=since)

    def output(self, run: str, step: str, *, allow_pickle: bool = False, as_json: bool = True) -> Any:
        """The step's return value; ``as_json=False`` keeps arrays as arrays."""
        from ..run.outputs import read_output, to_json

        value = read_output(run, step, self.home, allow_pickle=allow_pickle)
        return to_json(value, f"output of step {step!r}") if as_json else value

    def logs(self, run: str, step: str | None = None, *, attempt: int | None = None,
             follow: bool = False) -> Iterator[str]:
        return _decoded(self.log_bytes(run, step, attempt=attempt, follow=follow))  # checks now

    def log_bytes(self, run: str, step: str | None = None, *, attempt: int | None = None,
                  follow: bool = False) -> Iterator[bytes]:
        """The logs as raw bytes (what the attempts wrote, undecoded), streamed file by
        file. Bad arguments, an unknown run or step raise now, not at the first next()."""
        from ..errors import SegueError
        from ..run.logs import attempt_logs, follow_chunks, stream_logs

        if attempt is not None and (isinstance(attempt, bool) or attempt < 1):
            raise UsageError(f"attempt must be >= 1, not {attempt}")
        if follow and attempt is not None:
            raise UsageError("following shows every attempt as it starts; drop the attempt")
        store = self._reading()
        found = attempt_logs(self.home, store, run, step, attempt)  # checks the run and the step
        if follow:
            return follow_chunks(self.home, store, run, step)
        if attempt is not None and not found[0].path.exists():
            raise SegueError(f"no log of attempt {attempt} of step {step!r} at {found[0].path}: it "
                             f"ran before logs were kept per attempt (see `segue logs {run} {step}`)"
                             ", on another machine, or its log was deleted")
        return stream_logs(found, headers=attempt is None)

    def pool(self) -> PoolView:
        from ..scheduler.devices import ensure_host

        pool = self._open_pool()
        return self._pool_view(pool, ensure_host(pool, this_host()))

    def pools(self) -> list[PoolView]:
        """Every host of the pool, this host first: on a cluster-wide pool (a PostgreSQL
        store's) every host an agent or a ``segue pool set`` registered; on a machine's
        pool, this host; on either, each Ray cluster whose runs it queued (``ray:ADDRESS``).
        Only this host's driver is asked about processes."""
        pool = self._open_pool()
        here = self.pool()
        return [here, *(self._pool_view(pool, hp) for hp in pool.list_hosts()
                        if hp.host != here.host)]

    def _pool_view(self, pool: HostPoolStore, hp: HostPool) -> PoolView:
        from ..scheduler.devices import gpu_processes
        from ..scheduler.views import pool_doc

        local = hp.host == this_host() and any(not d.virtual for d in hp.devices)
        doc = pool_doc(hp, pool.list_allocations(hp.host), gpu_processes() if local else {},
                       home=self.pool_home)
        where = str(pool.path)
        if pool.cluster:
            from ..store.postgres import _label

            where = _label(where)  # never a password in output
        return PoolView(**{**doc, "devices": [DeviceView.from_json(d) for d in doc["devices"]],
                           "pool": where})

    def configure_pool(self, *, gpus: int, gpu_memory: str | int = "80GB", cpus: float | None = None,
                       memory: str | int | None = None, gpu_type: str | None = None,
                       groups: Sequence[tuple[int, str | int, str | None]] = ()) -> PoolView:
        """Set this host's pool to ``gpus`` virtual GPUs (for machines without a driver);
        the pool records the change with this client's actor (:meth:`pool_changes`).

        ``gpu_type`` names their type (e.g. 'rtx-pro-6000'), for steps with an
        ``accelerator=`` hint; ``groups`` adds more devices after them, as
        (count, memory, type or None) each, so a host can hold several types."""
        from ..scheduler.devices import host_memory, virtual_gpus

        devices: list[tuple[str, int, bool]] = []
        for n, size, kind in ((gpus, gpu_memory, gpu_type), *groups):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise UsageError(f"gpus must be an integer >= 0, not {n!r}")
            mem = parse_bytes(size, "gpu_memory", error=UsageError)
            devices += virtual_gpus(n, mem, kind, start=len(devices))
        if cpus is not None and not cpus > 0:
            raise UsageError("cpus must be > 0")
        host_mem = host_memory() if memory is None else parse_bytes(memory, "memory", error=UsageError)
        self._open_pool().configure_host(
            this_host(), cpus=cpus or float(os.cpu_count() or 1), memory=host_mem,
            devices=devices, source="configured", actor=self.actor)
        return self.pool()

    def detect_pool(self, *, replace: bool = False) -> PoolView:
        """Re-detect this host's GPUs (NVML or nvidia-smi); recorded like :meth:`configure_pool`."""
        from ..scheduler.devices import detect_gpus, host_memory

        pool = self._open_pool()
        host = this_host()
        source, devices = detect_gpus()
        old = pool.get_host(host)
        virtual = [d for d in old.devices if d.virtual] if old else []
        if virtual and not replace:
            # Detection would silently drop what someone configured on purpose.
            raise UsageError(
                f"the pool of {host} has {len(virtual)} configured virtual gpu"
                f"{'' if len(virtual) == 1 else 's'} and detection found {len(devices)} "
                f"({source}); pass --replace to replace them, or keep them")
        pool.configure_host(host, cpus=old.cpus if old else float(os.cpu_count() or 1),
                            memory=host_memory(), devices=devices, source=source, actor=self.actor)
        return self.pool()

    def pool_changes(self, *, limit: int = 100) -> list[PoolChange]:
        
        if check_changes_limit(limit) == 0:
            return []
        return self._open_pool().pool_changes(this_host(), limit=limit)

    def queue(self) -> list[QueueEntry]:
        from ..placement.policy import priority_name
        from ..scheduler.views import pinned_holders

        now = time.time()
        pool = self._open_pool()
        requests = pool.list_requests()
        hosts = {r.host for r in requests}  # the reason names who holds the devices now
        held = {h: (pool.list_allocations(h), pool.get_host(h)) for h in hosts}
        return [QueueEntry(
            home=r.home, run_id=r.run_id, step=r.step, host=r.host, priority=r.priority,
            priority_class=priority_name(r.priority), needs=r.need.describe(),
            waiting_s=round(now - r.submitted_at, 3), reason=r.reason + pinned_holders(r, *held[r.host]),
        ) for r in requests]

    def __repr__(self) -> str:
        return f"LocalClient({str(self.home.root)!r})"


def _decoded(chunks: Iterator[bytes]) -> Iterator[str]:
    """UTF-8 text of ``chunks``; a character cut between two chunks is joined again."""
    import codecs

    dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for chunk in chunks:
        if text := dec.decode(chunk):
            yield text
    if tail := dec.decode(b"", final=True):
        yield tail
