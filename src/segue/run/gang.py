"""A gang step (``@flow.step(world_size=N)``): N ranks, one checkpoint, committed in two phases.

The attempt's worker process is the gang's coordinator: it holds the task's
lease and epoch, heartbeats, and runs no rank itself. It starts the N ranks
behind the :class:`~segue.executor.pool.SubWorkerPool` seam (local processes
today) and speaks this protocol with each (rank -> coordinator, replies)::

    restore                   -> restored STATE RNG   the shards of the checkpoint a rank resumes from:
                                                     its state's and its RNG's (None, None: a first start)
    round KIND STEPS          -> round DUE SEQ PATH PAUSE
                                 a collective: answered once every rank asked (KIND: due | checkpoint)
    vote SEQ SHA NBYTES POS REPL                     phase one: its shard is durable (REPL: its
                                                     state is rank 0's, which alone wrote it)
                              -> committed SEQ PARK  phase two: every rank voted, the store recorded it
    progress DONE TOTAL                              rank 0's progress
    parked | done REF                                it parked after a commit | it returned
                                                     (rank 0 saved its value as the output at REF)

The two-phase commit of checkpoint SEQ at PATH:

1. A round decides the checkpoint (the interval, a pause, ``segue ckpt now``, or
   every rank calling ``ctx.checkpoint``); every rank gets the same SEQ and PATH.
2. Each rank writes its shard at ``PATH/rank-R``, an ordinary checkpoint whose
   manifest (sizes and hashes) is published last, and votes with its
   manifest's SHA-256.
3. Once all N voted, the coordinator publishes the gang manifest at PATH (a
   checkpoint naming every rank's shard with its manifest hash), then records
   the checkpoint in the store under its epoch: the commit point. Only then
   does a rank learn that it committed.
4. A rank that dies or fails, or a vote that does not come within
   ``$SEGUE_GANG_VOTE_TIMEOUT_S``, aborts: PATH is removed, every rank stops,
   the attempt fails, and the retry restarts the whole gang from the last
   committed checkpoint. A coordinator killed between the phases leaves an
   uncommitted PATH; the next attempt removes it before its ranks start.

Restore takes the newest committed gang checkpoint whose gang manifest and
every rank's shard verify (and match the hash that rank voted); a bad one is
quarantined, with a warning naming the checkpoint used instead. Pauses are
decided at a round, so every rank parks after the same committed checkpoint.

Replicated state (DDP: every rank holds the same weights and optimizer) is
declared with ``ctx.checkpoint(state, replicated=True)`` on every rank: rank 0
alone writes the state, each other rank only its RNG, and every rank restores
rank 0's state. Such a checkpoint can be *resharded*: resumed by another number
of ranks, each restoring rank 0's state (and its own old RNG, if it had a
rank). Data positions kept in that state reshard with it when they are global
(segue.data.GangSampler, GangReader). Any other checkpoint written by another
number of ranks is refused, with what to do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from .. import _faults
from .. import checkpoint as ckpt
from .._park import Park
from ..data.pool import pool_for
from ..errors import CheckpointCorruptError, SegueError
from ..executor.pool import SubWorkerPool
from ..home import Home
from ..states import Actor
from ..store.base import Store
from .context import StepContext
from .gang_recipe import GangAborted, RankRecipe, manifest_digest, shard_path

VOTE_TIMEOUT_ENV = "SEGUE_GANG_VOTE_TIMEOUT_S"
VOTE_TIMEOUT_S = 600.0


class GangError(SegueError):
    """The ranks broke the protocol (they asked at different steps) or the checkpoint
    belongs to another number of ranks: retrying cannot help."""

    segue_retryable = False


@dataclass
class _Voting:
    seq: int
    path: str
    steps: int | None
    park: bool
    deadline: float
    t0: float = field(default_factory=time.perf_counter)
    votes: dict[int, tuple[str, int, Any, bool]] = field(default_factory=dict)  # rank -> (sha, nbytes, position, replicated)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Gang:
    """Runs one attempt of a gang step; :meth:`run` returns the reference of the output
    rank 0 saved (None if it returned None), or raises Park."""

    def __init__(self, ctx: StepContext, store: Store, storage: ckpt.CheckpointStorage, *, home: Home,
                 devices: list[int] | None = None, pool: SubWorkerPool | None = None,
                 flow_path: str = "") -> None:
        self.ctx, self.store, self.storage, self.home = ctx, store, storage, home
        self.flow_path = flow_path  # the flow file the worker loaded (on Ray: this node's copy)
        self.n = ctx.spec.world_size
        self.devices = devices or []
        # Where the ranks run: by the factory the worker handed the context (beside this
        # process, or as Ray actors), else beside this process.
        self.pool = pool or pool_for(ctx, "rank", target=rank_main, resources=ctx.spec.resources,
                                     gang=self.n)
        self.timeout = float(os.environ.get(VOTE_TIMEOUT_ENV, VOTE_TIMEOUT_S))
        self._shards: list[str] | None = None  # chosen at the first restore
        self._replicated = False  # ...and whether its state is rank 0's alone
        self._swept: list[str] = []  # uncommitted checkpoints of earlier attempts, removed
        self._chosen = False
        self._rounds: dict[int, deque[tuple[str, int | None]]] = {r: deque() for r in range(self.n)}
        self._voting: _Voting | None = None
        self._parked: set[int] = set()
        self._done: dict[int, Any] = {}

    # -- the attempt ------------------------------------------------------------------
    def run(self) -> str | None:
        self._sweep()
        recipe = RankRecipe(home=str(self.home.root), store=self.home.store, flow_path=self.flow_path,
                            run_id=self.ctx.run_id, step=self.ctx.step,
                            epoch=self.ctx.epoch, world_size=self.n, master_port=_free_port(),
                            distributed=self.ctx.spec.distributed)
        per = len(self.devices) // self.n  # the allocation's devices, split evenly
        try:
            for r in range(self.n):
                mine = tuple(self.devices[r * per:(r + 1) * per]) or None
                self.pool.add(r, recipe, mine)
            return self._serve()
        except BaseException:
            self._abort()
            raise
        finally:
            self.pool.stop()

    def _serve(self) -> str | None:
        while True:
            v = self._voting
            if v is not None and time.monotonic() > v.deadline:
                missing = sorted(set(range(self.n)) - set(v.votes))
                raise GangAborted(f"rank{'s' if len(missing) > 1 else ''} {missing} did not vote for "
                                  f"checkpoint {v.seq} within {self.timeout:g}s "
                                  f"(${VOTE_TIMEOUT_ENV}); the gang restarts from its last commit")
            for rank, msg in self.pool.recv(0.2):
                self._on(rank, msg)
            waiting = [r for r, q in self._rounds.items() if q]
            if waiting and (self._done or self._parked):
                ended = sorted(self._done.keys() | self._parked)
                raise GangError(f"ranks {ended} of gang step {self.ctx.step!r} ended while ranks "
                                f"{waiting} wait in a checkpoint round: every rank must call "
                                "ctx.checkpoint_due and ctx.checkpoint equally often")
            if len(self._done) == self.n:
                return cast("str | None", self._done[0])
            if len(self._parked) == self.n:
                raise Park()

    def _on(self, rank: int, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "restore":
            self.pool.send(rank, ("restored", *self._restore_choice(rank)))
        elif kind == "round":
            self._rounds[rank].append((msg[1], msg[2]))
            if all(self._rounds.values()):
                self._round([q.popleft() for _, q in sorted(self._rounds.items())])
        elif kind == "vote":
            self._vote(rank, msg[1], msg[2], msg[3], msg[4], bool(msg[5]))
        elif kind == "progress" and rank == 0:
            self.ctx.progress(msg[1], msg[2])
        elif kind == "parked":
            self._parked.add(rank)
            self.pool.leaving(rank)  # its exit now is no loss
        elif kind == "done":
            self._done[rank] = msg[1]
            self.pool.leaving(rank)

    # -- restore ----------------------------------------------------------------------
    def _restore_choice(self, rank: int) -> tuple[str | None, str | None]:
        """(the shard whose state ``rank`` restores, the shard whose RNG it restores)."""
        if not self._chosen:
            payload = self.ctx.restore_payload(check=self._check)
            self._chosen = True
            self._say_restored()
            if payload is not None:
                gang = payload["state"]["gang"]
                self._shards = [r["path"] for r in gang["ranks"]]
                self._replicated = bool(gang.get("replicated"))
                if len(self._shards) != self.n:
                    self._say_resharded(gang)
        if self._shards is None:
            return None, None
        rng = self._shards[rank] if rank < len(self._shards) else None
        return (self._shards[0] if self._replicated else self._shards[rank]), rng

    def _event(self, reason: str, **data: Any) -> None:
        self.store.append_event(self.ctx.run_id, "checkpoint", actor=Actor.WORKER, step=self.ctx.step,
                                reason=reason, data=data)

    def _say_restored(self) -> None:
        """On a retry, say which committed checkpoint the gang goes on from, and what
        uncommitted one was left behind (the fallback must never be silent)."""
        seq = self.ctx.restored_seq
        if self.ctx.attempt <= 1 and not self._swept:
            return
        said = [f"resumes from committed checkpoint {seq}" if seq is not None
                else "starts from the beginning: no checkpoint committed"]
        if self._swept:
            said.append(f"uncommitted checkpoint{'s' if len(self._swept) > 1 else ''} "
                        f"{', '.join(self._swept)} removed")
        self._event(f"gang step {self.ctx.step!r} {'; '.join(said)}", restored_seq=seq, removed=self._swept)

    def _say_resharded(self, gang: dict[str, Any]) -> None:
        old = int(gang["world_size"])
        reason = (f"resharding the replicated checkpoint of gang step {self.ctx.step!r} from {old} "
                  f"to {self.n} ranks: every rank restores rank 0's state; "
                  + (f"ranks {old}..{self.n - 1} had none, so their RNG starts as the step seeds it"
                     if self.n > old else f"ranks {self.n}..{old - 1}'s RNG is dropped"))
        self._event(reason, **{"from": old, "to": self.n})

    def _check(self, payload: Any) -> None:
        """Reject a gang checkpoint whose any rank's shard fails verification."""
        state = payload["state"]
        gang = state.get("gang") if isinstance(state, dict) else None  # None: a one-process step's
        n = 1 if gang is None else int(gang["world_size"])
        if n != self.n and (gang is None or not gang.get("replicated")):
            raise GangError(
                f"step {self.ctx.step!r} has world_size={self.n} but its last checkpoint was written "
                f"by {n} rank{'s' if n > 1 else ''} and is not replicated, so segue cannot reshard it; "
                f"declare world_size={n} again, or start the step over with "
                f"`segue resume {self.ctx.run_id} --restart-step {self.ctx.step}` (a gang whose ranks "
                "hold the same state, as with DDP, reshards when every rank checkpoints with "
                "ctx.checkpoint(state, replicated=True))")
        assert gang is not None  # a gang has two ranks or more
        for r in gang["ranks"]:
            path = r["path"]
            try:
                sha, _ = manifest_digest(self.storage, path)
            except FileNotFoundError:
                raise CheckpointCorruptError(path, f"rank {r['rank']}'s shard is missing") from None
            if sha != r["manifest_sha256"]:
                raise CheckpointCorruptError(path, f"rank {r['rank']}'s manifest is not the one it voted")
            ckpt.verify(self.storage, path)

    # -- the two phases ---------------------------------------------------------------
    def _round(self, asked: list[tuple[str, int | None]]) -> None:
        if len(set(asked)) > 1:
            said = ", ".join(f"rank {r} {k} at step {s}" for r, (k, s) in enumerate(asked))
            raise GangError(f"the ranks of gang step {self.ctx.step!r} disagree ({said}): every rank "
                            "must call ctx.checkpoint_due and ctx.checkpoint at the same steps, as "
                            "with any collective")
        if self._voting is not None:
            raise GangError(f"the ranks of gang step {self.ctx.step!r} asked again at step {asked[0][1]} "
                            f"instead of taking checkpoint {self._voting.seq}: once ctx.checkpoint_due "
                            "answers True, every rank must call ctx.checkpoint")
        kind, steps = asked[0]
        due = kind == "checkpoint" or self.ctx.checkpoint_due(steps)
        pause = self.ctx.pause_requested
        seq, path = self.ctx.claim_seq() if due else (0, "")
        if due:
            self._voting = _Voting(seq, path, steps, park=pause,
                                   deadline=time.monotonic() + self.timeout)
        for r in range(self.n):
            self.pool.send(r, ("round", due, seq, path, pause))

    def _vote(self, rank: int, seq: int, sha: str, nbytes: int, position: Any, replicated: bool) -> None:
        v = self._voting
        if v is None or v.seq != seq:
            raise GangError(f"rank {rank} voted for checkpoint {seq}, which is not being taken")
        v.votes[rank] = (sha, nbytes, position, replicated)
        if len(v.votes) < self.n:
            return
        said = {r: vote[3] for r, vote in v.votes.items()}
        if len(set(said.values())) > 1:
            yes = sorted(r for r, x in said.items() if x)
            no = sorted(r for r, x in said.items() if not x)
            raise GangError(f"ranks {yes} of gang step {self.ctx.step!r} checkpointed with replicated=True "
                            f"and ranks {no} without: every rank must pass the same replicated= to "
                            "ctx.checkpoint")
        replicated = said[0]
        _faults.fault_point("gang.before_manifest")
        ranks: list[dict[str, Any]] = [{"rank": r, "path": shard_path(v.path, r), "manifest_sha256": v.votes[r][0],
                  "nbytes": v.votes[r][1]} for r in range(self.n)]
        gang = {"world_size": self.n, "ranks": ranks, "replicated": replicated}
        saved = ckpt.save(self.storage, v.path, {"state": {"gang": gang}, "rng": {}},
                          meta={"run_id": self.ctx.run_id, "step": self.ctx.step, "seq": v.seq,
                                "epoch": self.ctx.epoch, "gang": self.n})
        _faults.fault_point("gang.before_commit")
        nbytes = saved.nbytes + sum(r["nbytes"] for r in ranks)
        position = {"ranks": [v.votes[r][2] for r in range(self.n)]}
        self.ctx.commit(v.seq, v.path, position, nbytes=nbytes, duration_s=time.perf_counter() - v.t0,
                        prune=False)
        self.ctx.saved(v.steps)
        self._voting = None
        for r in range(self.n):
            self.pool.send(r, ("committed", v.seq, v.park))
        self.ctx.apply_retention()  # while the ranks go on: the next round waits for this loop anyway

    def _abort(self) -> None:
        """Remove the checkpoint being taken: without its store record it never existed."""
        v, self._voting = self._voting, None
        if v is None:
            return
        missing = sorted(set(range(self.n)) - set(v.votes))
        try:
            self.storage.remove_tree(v.path)
            fate = "removed"
        except OSError:
            fate = "left for the next attempt's sweep"
        # On the way out of the failure that aborted it: an event that cannot be written
        # must not hide that failure.
        with contextlib.suppress(Exception):
            self._event(f"checkpoint {v.seq} of gang step {self.ctx.step!r} aborted (voted: ranks "
                        f"{sorted(v.votes)}; missing: {missing}); {v.path} {fate}",
                        seq=v.seq, voted=sorted(v.votes), missing=missing)

    def _sweep(self) -> None:
        """Remove what earlier attempts left uncommitted (a coordinator killed mid-commit)."""
        base = f"runs/{self.ctx.run_id}/{self.ctx.step}/ckpt"
        known = {c.path for c in self.store.list_checkpoints(
            self.ctx.run_id, self.ctx.step, statuses=("committed", "quarantined", "pruned"))}
        for name in self.storage.listdir(base):
            path = f"{base}/{name}"
            epoch = name.rpartition("-e")[2]
            if path not in known and epoch.isdigit() and int(epoch) < self.ctx.epoch:
                self.storage.remove_tree(path)
                self._swept.append(path)


def rank_main(conn: Any, parent_pid: int, rank: int, recipe: RankRecipe,
              devices: tuple[int, ...] | None) -> None:
    """A rank process's entry point (spawned: imported by name)."""
    from .gang_rank import main

    main(conn, parent_pid, rank, recipe, devices)
