"""The worker process: runs one attempt of one step, then exits.

Started by an executor as ``python -m segue.run.worker --home H --run R
--step S --epoch E``. The controller already began the attempt in the store
(epoch E); the worker only ever commits under that epoch. Exit codes tell the
controller what happened; the store holds what was committed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import signal
import sqlite3
import sys
import threading
import time
import traceback
from typing import Any

from .. import _faults
from .._canon import digest
from .._procs import die_with_parent
from .._rngshield import shield_libraries
from ..errors import FencedError, NoValidCheckpointError
from ..executor.exits import (
    EXIT_FAILED,
    EXIT_FENCED,
    EXIT_OK,
    EXIT_ORPHANED,
    EXIT_PARKED,
    exit_report_path,
    write_exit_report,
)
from ..executor.ray_lean import own_process
from ..flow import load_flow
from ..home import Home
from ..hostname import this_host, use_host
from ..states import Actor, RunState, TaskState
from ..store.base import Store
from .context import Flags, Park, StepContext
from .environment import ImportsRecorder
from .outage import EXIT_DISK_FULL, disk_full_line, is_disk_full
from .paths import decided, snapshot_inputs, task_path
from .stepio import flow_file, input_loader, save_output
from .worker_options import WorkerOptions

log = logging.getLogger("segue.worker")


class Heartbeat(threading.Thread):
    """Renews the lease, learns about pause requests, flushes progress and the
    metrics logged since the last beat (one write for all of them).

    A fenced heartbeat means a newer attempt owns the step: this process is a
    zombie and stops itself at once; anything it would still commit would be
    rejected anyway.
    """

    def __init__(
        self, store: Store, run_id: str, step: str, epoch: int, ttl_s: float,
        flags: Flags, parent_pid: int,
    ) -> None:
        super().__init__(name="segue-heartbeat", daemon=True)
        self.store, self.run_id, self.step, self.epoch = store, run_id, step, epoch
        self.ttl_s = ttl_s
        self.interval = min(1.0, ttl_s / 4)
        self.flags = flags
        self.parent_pid = parent_pid
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            if os.getppid() != self.parent_pid:
                os._exit(EXIT_ORPHANED)
            try:
                hb = self.store.heartbeat(self.run_id, self.step, self.epoch, self.ttl_s)
                if hb.run_state in (RunState.PAUSING, RunState.PAUSED, RunState.CANCELLED):
                    self.flags.pause_requested = True
                self.flags.flush_progress(
                    lambda done, total: self.store.report_progress(self.run_id, self.step, self.epoch,
                                                                   done, total))
                self.flags.metrics.flush(
                    lambda points: self.store.put_metrics(self.run_id, self.step, points,
                                                          epoch=self.epoch))
            except FencedError:
                if self.stop_event.is_set():
                    return  # the attempt itself just parked or completed the task
                self.flags.fenced = True
                os._exit(EXIT_FENCED)
            except Exception as exc:  # a busy database must not kill the step
                log.warning("heartbeat failed: %s", exc)


def describe_error(exc: BaseException, home: Home, run_id: str) -> str:
    """One line for the operator; a full disk says what it stopped, where, and what to do."""
    if is_disk_full(exc):
        checkpoint = getattr(exc, "segue_checkpoint", None)
        if checkpoint is not None:
            where = getattr(exc, "filename", None) or home.root
            return disk_full_line(f"checkpoint {checkpoint}", where, run_id)
        if isinstance(exc, sqlite3.Error):
            return disk_full_line(f"the metadata store {home.db_path}", home.db_path, run_id)
        where = getattr(exc, "filename", None) or home.root
        return disk_full_line(str(where), where, run_id)
    return f"{type(exc).__name__}: {exc}"


def run_attempt(home: Home, run_id: str, step: str, epoch: int, parent_pid: int,
                options: WorkerOptions | None = None) -> int:
    """``options``: the record the controller handed this worker (its store is ``home``'s
    already); what the step's data layer needs of it goes to the step's context."""
    from ..data.elastic import Placement  # (the data layer: only when a step runs)
    from ..data.pool import default_pool
    from ..store.pools import open_pool
    from ..store.postgres import _label as masked  # a cluster's pool is a URL: no password in logs

    opts = options or WorkerOptions()
    flags = Flags()

    def on_pause_signal(signum: int, frame: Any) -> None:
        flags.pause_requested = True  # handlers only set flags

    def on_checkpoint_signal(signum: int, frame: Any) -> None:
        flags.checkpoint_requested = True

    signal.signal(signal.SIGUSR1, on_pause_signal)
    signal.signal(signal.SIGUSR2, on_checkpoint_signal)
    signal.signal(signal.SIGTERM, on_pause_signal)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the controller
    die_with_parent(parent_pid, EXIT_ORPHANED)
    _faults.set_role("worker", epoch)

    store = home.open_store()
    run = store.get_run(run_id)
    storage = home.run_storage(run)
    task = store.get_task(run_id, step)
    try:
        store.set_attempt_pid(run_id, step, epoch, os.getpid(), this_host())
    except FencedError:
        return EXIT_FENCED
    ttl = float(run.options.get("lease_ttl_s", 10.0))
    hb = Heartbeat(store, run_id, step, epoch, ttl, flags, parent_pid)
    hb.start()
    _faults.fault_point("worker.started")
    ctx: StepContext | None = None
    imports = ImportsRecorder(store, run_id, step, epoch)  # what the step's process imported
    try:
        flow_path = flow_file(run, opts.ray.flow_file if opts.ray else None)  # on Ray: this node's copy
        loaded = load_flow(flow_path)
        spec = loaded.flow.spec_of(step)  # a fan-out's item or a loop's iteration runs its step
        load_input = input_loader(store, storage, run_id, spec.allow_pickle)

        ctx = StepContext(
            run_id=run_id, spec=spec, params=run.params, epoch=epoch, attempt=task.attempts,
            store=store, storage=storage, flags=flags,
            load_input=load_input, task=step, path=task_path(spec, step, load_input),
            code_fingerprint=digest(loaded.fingerprint),
            previous_progress=(task.progress_done, task.progress_total),
            home=home, options=run.options,
            placement=Placement(devices=opts.devices, home=opts.pool_home or None, host=opts.pool_host or None,
                                open_pool=None if not opts.pool else functools.partial(open_pool, opts.pool),
                                pool_name=masked(opts.pool or "")),
            pool_factory=functools.partial(default_pool, ray=opts.ray),
        )
        shield_libraries()  # after the store and the storage imported their clients
        ctx.before_commit = imports.note  # each committed state has its imports on record
        if spec.world_size > 1:  # this process coordinates the gang's ranks
            from .gang import Gang

            # The devices this process sees: the allocation's, or on Ray the GPUs Ray gave it.
            devices = list(opts.ray.gpus if opts.ray else opts.devices)
            # Rank 0 saved the output itself (it never crosses a pipe): its reference.
            ref = Gang(ctx, store, storage, home=home, devices=devices, flow_path=flow_path).run()
            ctx.close()
        else:
            ctx.prepare_scratch()  # ctx.scratch holds the restored checkpoint's files
            # The files it decides from, as they are now: before it reads them.
            inputs = snapshot_inputs(spec, run.params) if spec.inputs else None
            result = spec.fn(ctx)
            ctx.close()  # the last checkpoint's commit lands before the output's
            path = decided(spec, ctx.chosen, result, inputs)  # a choice, a loop's verdict: saved with it
            ref = None if result is None and path is None else save_output(
                storage, run_id, step, epoch, result, allow_pickle=spec.allow_pickle, path=path)
        _faults.fault_point("worker.before_complete")
        ctx.flush_progress()
        ctx.flush_metrics(final=True)
        hb.stop_event.set()
        store.complete_task(run_id, step, epoch, output_ref=ref, actor=Actor.WORKER)
        _faults.fault_point("worker.after_complete")
        return EXIT_OK
    except Park:
        if ctx is not None:  # the parking checkpoint flushed; points logged since it, if any
            with contextlib.suppress(Exception):
                ctx.flush_metrics(final=True)
        hb.stop_event.set()
        store.transition_task(run_id, step, TaskState.PARKED, actor=Actor.WORKER, epoch=epoch,
                              reason="parked at a checkpoint on a pause request")
        return EXIT_PARKED
    except FencedError:
        return EXIT_FENCED
    except BaseException as exc:  # report everything, including KeyboardInterrupt
        # A retry cannot fix a step whose every checkpoint is bad: it would
        # silently start from scratch. Only the operator's resume may do that.
        retryable = not isinstance(exc, NoValidCheckpointError) and getattr(
            exc, "segue_retryable", True)
        if ctx is not None:  # what it logged before failing (a loss gone NaN) helps find why
            with contextlib.suppress(Exception):
                ctx.flush_metrics(final=True)
        error = describe_error(exc, home, run_id)
        write_exit_report(exit_report_path(home, run_id, step, epoch),
                          {"error": error, "traceback": traceback.format_exc(), "retryable": retryable})
        with contextlib.suppress(OSError):  # the log is on the same (maybe full) disk
            traceback.print_exc()
        if is_disk_full(exc):
            # Parked, not failed: retrying on a full disk only burns the retries.
            with contextlib.suppress(OSError):
                print(f"segue: {error}", file=sys.stderr)
            return EXIT_DISK_FULL
        return EXIT_FAILED
    finally:
        hb.stop_event.set()
        imports.note()  # and once more at the attempt's end (never raises)
        if ctx is not None:
            with contextlib.suppress(OSError):
                ctx.drop_scratch()


def main(argv: list[str] | None = None) -> None:
    own_process()  # (segue.executor.ray_lean)
    p = argparse.ArgumentParser(prog="segue-worker")
    p.add_argument("--home", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--step", required=True)
    p.add_argument("--epoch", required=True, type=int)
    p.add_argument("--parent-pid", required=True, type=int)
    p.add_argument("--warm", type=int, default=0,
                   help="sub-workers segue._worker_main started first (segue.executor.local_warm)")
    p.add_argument("--options-stdin", action="store_true",
                   help="read the controller's options record from stdin (run.worker_options)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    # The one record of what the controller tells this worker; nothing comes through
    # the environment. Read before anything records this host's name or opens the store.
    opts = WorkerOptions.from_json(json.loads(sys.stdin.readline())) if a.options_stdin else WorkerOptions()
    if opts.host:
        use_host(opts.host)
    t0 = time.time()
    try:
        code = run_attempt(Home.resolve(a.home, store=opts.store), a.run, a.step, a.epoch, a.parent_pid,
                           opts)
    except BaseException as exc:
        # Raised while reporting an outcome (parking, say) on a full disk: the
        # exit code is the one report that needs no space.
        if not is_disk_full(exc):
            raise
        code = EXIT_DISK_FULL
    log.info("attempt epoch %d of %s ended with exit code %d after %.2fs", a.epoch, a.step, code, time.time() - t0)
    with contextlib.suppress(OSError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: the heartbeat thread may hold a connection


if __name__ == "__main__":
    main()
