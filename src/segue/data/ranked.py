"""Data for the ranks of a gang step, with one global position that reshards.

torch's ``DistributedSampler`` gives rank ``r`` the records ``r, r+N, ...`` of
each epoch: its position is per rank and means nothing to another number of
ranks. Here every rank walks the same *global* order in global batches of
``world_size * batch_size`` records and takes its own block of each:

    global batch k = order[k*W*B : (k+1)*W*B];   rank r takes [r*B : (r+1)*B] of it

The position is the number of records of the global order consumed (and the
epoch), the same on every rank after every global batch. A checkpoint holding
it in a replicated state (``ctx.checkpoint(state, replicated=True)``) can be
resumed by another number of ranks: they go on from the same global record,
cutting the rest into their own blocks, so no record is lost or repeated.

- :class:`GangSampler`: indices of a map-style dataset of ``n`` records, shuffled
  per epoch from ``seed`` (the order depends on the seed and the epoch, never on
  the number of ranks).
- :class:`GangReader`: the records of a :class:`~segue.data.sources.Source`, its
  shards in their order. Every rank reads the whole stream and keeps its block
  (the reading is repeated on every rank; the records are not).

The last global batch of an epoch (or the stream) may be short: ranks then get
fewer records, or none (``drop_last=True`` skips it instead, losing those
records by request). A step whose ranks must see equal batches (DDP) chooses
sizes that divide, or handles an empty batch.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from typing import Any

from ..errors import PositionError, UsageError
from .sources.base import Position, Source


def _check_sizes(batch_size: int, world_size: int) -> None:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise UsageError(f"batch_size must be an int >= 1 (records per rank and global batch), "
                         f"not {batch_size!r}")
    if world_size < 1:
        raise UsageError(f"world_size must be >= 1, not {world_size!r}")


class GangSampler:
    """This rank's indices of each global batch of a dataset of ``n`` records.

    ``for idx in sampler:`` walks what remains of the current epoch, then moves
    to the next one; :attr:`position` (JSON) is where it is, to keep in the
    checkpointed state, and :meth:`load` goes back there, with any number of ranks.
    """

    def __init__(self, ctx: Any, n: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise UsageError(f"GangSampler needs the number of records n as an int >= 0, not {n!r}")
        self.rank, self.world_size = int(ctx.rank), int(ctx.world_size)
        _check_sizes(batch_size, self.world_size)
        self.n, self.batch_size, self.shuffle, self.seed = n, batch_size, shuffle, int(seed)
        self.drop_last = drop_last
        self.epoch, self.offset = 0, 0

    @property
    def position(self) -> Position:
        return {"epoch": self.epoch, "offset": self.offset, "n": self.n, "seed": self.seed,
                "shuffle": self.shuffle}

    def load(self, position: Position) -> None:
        """Go on from ``position`` (a :attr:`position` of any number of ranks)."""
        said = {k: position.get(k) for k in ("n", "seed", "shuffle")}
        mine = {"n": self.n, "seed": self.seed, "shuffle": self.shuffle}
        if said != mine:
            raise PositionError(f"this GangSampler ({mine}) cannot go on from a position of another "
                             f"order ({said}): give it the n, seed and shuffle it was saved with")
        self.epoch, self.offset = int(position["epoch"]), int(position["offset"])

    def order(self, epoch: int) -> list[int]:
        """The global order of ``epoch``: the same for every number of ranks."""
        idx = list(range(self.n))
        if self.shuffle:  # str seeds hash with SHA-512: the same on every Python and platform
            random.Random(f"segue.GangSampler:{self.seed}:{epoch}").shuffle(idx)
        return idx

    def __iter__(self) -> Iterator[list[int]]:
        order = self.order(self.epoch)
        step = self.world_size * self.batch_size
        while self.offset < self.n:
            batch = order[self.offset:self.offset + step]
            if self.drop_last and len(batch) < step:
                break
            self.offset += len(batch)  # consumed once yielded: a checkpoint after it covers it
            yield batch[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
        self.epoch, self.offset = self.epoch + 1, 0


class GangReader:
    """This rank's records of each global batch of a :class:`Source`'s stream.

    The source is snapshotted when the reader is made; :attr:`position` carries
    the snapshot's digest, and :meth:`load` refuses a position of another input.
    """

    def __init__(self, ctx: Any, source: Source, batch_size: int, *, drop_last: bool = False) -> None:
        self.rank, self.world_size = int(ctx.rank), int(ctx.world_size)
        _check_sizes(batch_size, self.world_size)
        self.source, self.batch_size, self.drop_last = source, batch_size, drop_last
        snapshot = source.snapshot()
        self._input = hashlib.sha256(json.dumps(snapshot, sort_keys=True).encode()).hexdigest()[:16]
        self._shards = source.shards(snapshot)
        self.shard = 0
        self.at: Position = self._shards[0].start() if self._shards else {}
        self.records = 0  # of the global stream, consumed

    @property
    def position(self) -> Position:
        return {"shard": self.shard, "at": self.at, "records": self.records, "input": self._input}

    def load(self, position: Position) -> None:
        if position.get("input") != self._input:
            raise PositionError("the input of this GangReader changed since its position was saved "
                             f"(snapshot {position.get('input')} then, {self._input} now): restore "
                             "the input, or start the step over with --restart-step")
        self.shard, self.at, self.records = int(position["shard"]), dict(position["at"]), \
            int(position["records"])

    def _take(self, want: int) -> list[Any]:
        """Up to ``want`` records from the position on; the position moves past them."""
        got: list[Any] = []
        while len(got) < want and self.shard < len(self._shards):
            shard = self._shards[self.shard]
            batches = shard.read(self.at, batch=want - len(got))
            batch = next(batches, None)
            close = getattr(batches, "close", None)
            if close is not None:
                close()  # read afresh from the new position next time
            if batch is None or not batch.records:
                self.shard += 1
                self.at = self._shards[self.shard].start() if self.shard < len(self._shards) else {}
                continue
            if len(batch.records) > want - len(got):  # its position would skip records
                raise PositionError(f"shard {shard.key!r} of {type(self.source).__name__} read more "
                                 f"records than asked ({len(batch.records)} > {want - len(got)}); "
                                 "a Shard.read must yield at most `batch` records at a time")
            got += batch.records
            self.at = batch.position
        return got

    def __iter__(self) -> Iterator[list[Any]]:
        step = self.world_size * self.batch_size
        while True:
            saved = (self.shard, self.at, self.records)
            batch = self._take(step)
            if not batch or (self.drop_last and len(batch) < step):
                self.shard, self.at, self.records = saved  # (a dropped tail stays unread)
                return
            self.records += len(batch)
            yield batch[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
