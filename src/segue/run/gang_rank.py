"""One rank of a gang step: runs the step function with its own ``ctx.rank``.

It owns nothing durable by itself: it writes its shard of a checkpoint and
votes; only the coordinator (run/gang.py, the attempt's worker process)
commits. It dies with the coordinator, and learns about pauses from the
coordinator's answers, never from signals.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

from .. import _faults
from .. import checkpoint as ckpt
from .._canon import digest
from .._park import Park
from .._procs import die_with_parent
from ..flow import load_flow
from ..home import Home
from . import rng
from .context import Flags, StepContext
from .gang_recipe import GangAborted, RankRecipe, manifest_digest, shard_path
from .stepio import flow_file, input_loader, save_output

PROGRESS_EVERY_S = 0.25  # rank 0's progress reaches the coordinator at most this often


class RankContext(StepContext):
    """A rank's step context: checkpoints and pauses are the gang's, decided with the
    coordinator; everything else (params, inputs, events) is the step's own."""

    def __init__(self, conn: Connection, rank: int, world_size: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.rank, self.world_size = rank, world_size
        self._conn = conn
        self._assigned: tuple[int, str] | None = None  # the checkpoint a round decided
        self._progress_at = 0.0

    def restore(self, *, like: Any = None) -> Any | None:
        """This rank's state in the gang's latest committed checkpoint (every shard of it
        verified by the coordinator), or None on a first start. A replicated checkpoint's
        state is rank 0's, whatever the number of ranks that wrote it. ``like``: as
        :meth:`StepContext.restore`, checked against this rank's shard."""
        self._conn.send(("restore",))
        _, state_shard, rng_shard = self._answer("restored")
        if state_shard is None:
            return None
        if like is not None:
            self._check_like(state_shard, ckpt.read_manifest(self._storage, state_shard), like)
        # The coordinator has just hashed every file of every shard against the manifest
        # its rank voted: hashing them again here would read the checkpoint twice.
        loaded = ckpt.load(self._storage, state_shard, allow_pickle=self.spec.allow_pickle, verify=False)
        if rng_shard is not None:  # None: a rank the checkpoint had not (resharded to more)
            own = loaded if rng_shard == state_shard else ckpt.load(
                self._storage, rng_shard, allow_pickle=self.spec.allow_pickle, verify=False)
            rng.restore(own.state.get("rng", {}))
        return loaded.state["state"]

    def checkpoint_due(self, steps: int | None = None) -> bool:
        """A collective: every rank must call it at the same ``steps``; all get the same answer."""
        if steps is not None:
            self._cur_steps = steps
        due, seq, path = self._round("due")
        self._assigned = (seq, path) if due else None
        return due

    def checkpoint(self, state: Any, *, position: Any = None, durable: bool = False,
                   replicated: bool = False) -> None:
        """Write this rank's shard, vote, and wait until the gang's checkpoint committed
        (every checkpoint of a gang is durable when this returns); then park if paused.

        ``replicated=True`` (on every rank alike) says every rank holds the same
        ``state``, as with DDP: rank 0 alone writes it, the others only their RNG,
        every rank restores rank 0's, and the checkpoint may be resumed by another
        number of ranks (see run/gang.py)."""
        if self._assigned is None:
            self._round("checkpoint")
        assert self._assigned is not None
        (seq, path), self._assigned = self._assigned, None
        shard = shard_path(path, self.rank)
        pos = position if position is not None else {"seq": seq, "steps": self._cur_steps}
        # Written in line (a vote comes only after durability, so nothing is staged).
        mine = None if replicated and self.rank else state  # rank 0's copy stands for all
        saved = self._writer.save(
            shard, {"state": mine, "rng": rng.capture()},
            meta={"run_id": self.run_id, "step": self.step, "seq": seq, "epoch": self.epoch,
                  "rank": self.rank, "position": pos, "replicated": replicated,
                  "code_fingerprint": self._fingerprint})
        sha, size = manifest_digest(self._storage, shard)
        _faults.fault_point("gang.before_vote")
        self._conn.send(("vote", seq, sha, saved.nbytes + size, pos, replicated))
        _faults.fault_point("gang.after_vote")
        _, _, park = self._answer("committed")
        self.checkpoints_written += 1
        if park:
            raise Park()

    def progress(self, done: float, total: float | None = None) -> None:
        super().progress(done, total)
        if time.monotonic() - self._progress_at >= PROGRESS_EVERY_S:
            self._send_progress()

    def close(self) -> None:
        self._writer.close()
        self._send_progress()

    def _send_progress(self) -> None:
        """Rank 0's progress, if it changed since it was last sent (the coordinator's
        heartbeat flushes it to the store)."""
        if self.rank == 0 and self._flags.progress_dirty and self._flags.progress is not None:
            self._flags.progress_dirty = False
            self._progress_at = time.monotonic()
            self._conn.send(("progress", *self._flags.progress))

    def _round(self, kind: str) -> tuple[bool, int, str]:
        self._send_progress()  # a throttled report goes out at the latest with the next round
        self._conn.send(("round", kind, self._cur_steps))
        _, due, seq, path, pause = self._answer("round")
        self._flags.pause_requested = bool(pause)
        if due:
            self._assigned = (seq, path)
        return bool(due), seq, path

    def _answer(self, kind: str) -> tuple[Any, ...]:
        msg = self._conn.recv()
        if msg[0] != kind:
            raise GangAborted(f"rank {self.rank} expected {kind!r} from the coordinator, got {msg[0]!r}")
        return tuple(msg)


def _join_process_group(backend: str, rank: int, recipe: RankRecipe) -> Callable[[], None]:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=f"tcp://{recipe.master_addr}:{recipe.master_port}", rank=rank,
                            world_size=recipe.world_size, timeout=timedelta(seconds=120))
    return dist.destroy_process_group


def main(conn: Connection, parent_pid: int, rank: int, recipe: RankRecipe,
         devices: tuple[int, ...] | None) -> None:
    die_with_parent(parent_pid, 3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # pauses come from the coordinator
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    if devices:  # before anything imports a framework: CUDA reads it once
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(recipe.world_size),
                       "LOCAL_WORLD_SIZE": str(recipe.world_size), "MASTER_ADDR": recipe.master_addr,
                       "MASTER_PORT": str(recipe.master_port)})
    _faults.set_role(f"rank{rank}", recipe.epoch)
    leave: Callable[[], None] | None = None
    try:
        home = Home.resolve(recipe.home, store=recipe.store)
        store = home.open_store()
        run = store.get_run(recipe.run_id)
        storage = home.run_storage(run)
        loaded = load_flow(flow_file(run, recipe.flow_path))
        spec = loaded.flow.steps[recipe.step]

        task = store.get_task(recipe.run_id, recipe.step)
        ctx = RankContext(conn, rank, recipe.world_size, run_id=recipe.run_id, spec=spec, params=run.params,
                          epoch=recipe.epoch, attempt=task.attempts, store=store, storage=storage,
                          flags=Flags(), load_input=input_loader(store, storage, recipe.run_id, spec.allow_pickle),
                          code_fingerprint=digest(loaded.fingerprint),
                          previous_progress=(task.progress_done, task.progress_total), home=home,
                          options=run.options)
        if recipe.distributed:
            leave = _join_process_group(recipe.distributed, rank, recipe)
        value = spec.fn(ctx)
        ctx.close()
        ref = None
        if rank == 0 and value is not None:  # the step's output: saved here, never pickled
            ref = save_output(storage, recipe.run_id, recipe.step, recipe.epoch, value,
                              allow_pickle=spec.allow_pickle)
        conn.send(("done", ref))
    except Park:
        conn.send(("parked",))
    except BaseException as exc:  # noqa: BLE001 - reported to the coordinator, which fails the attempt
        with contextlib.suppress(OSError, EOFError):
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"))
    finally:
        if leave is not None:
            with contextlib.suppress(Exception):
                leave()
