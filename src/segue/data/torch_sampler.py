"""A torch sampler and loader that resume mid-epoch with the same batches.

:class:`ResumableSampler` orders a map-style dataset of ``size`` records per epoch,
shuffled from ``(seed, epoch)`` with its own ``torch.Generator``; its position is
the epoch and the offset (records of that epoch's order consumed), plain JSON.

:class:`ResumableLoader` wraps a plain ``DataLoader`` built over such a sampler. With
workers the DataLoader pulls indices from the sampler ahead of the training loop
(``prefetch_factor * num_workers`` batches), so the sampler's own count runs ahead of
what the loop consumed: the loader moves the position only when a batch reaches the
loop, and that position is what a checkpoint stores. It also gives the DataLoader a
generator of its own per epoch: a DataLoader without one draws its workers' seed from
torch's global RNG each time its iterator starts, and a resumed attempt starts it at
another point, so the global RNG (dropout, ...) would part from an uninterrupted run's.

Both are stored by ``ctx.checkpoint`` through ``state_dict()`` (see
segue.checkpoint._stateful); after ``ctx.restore()`` call ``load_state_dict`` on them,
as on a model or an optimizer. This module imports torch: import it where torch is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sized
from typing import Any

import torch  # type: ignore[import-not-found, unused-ignore]
from torch.utils.data import DataLoader, IterableDataset, Sampler  # type: ignore[import-not-found, unused-ignore]

from ..errors import PositionError, UsageError

__all__ = ["ResumableLoader", "ResumableSampler"]


def _seed(*parts: object) -> int:
    """A 63-bit seed from ``parts``: no two (seed, epoch) pairs share one, as seed+epoch would."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _generator(*parts: object) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(_seed(*parts))
    return g


class ResumableSampler(Sampler[int]):  # type: ignore[misc, unused-ignore]
    """Indices of a dataset of ``size`` records, one epoch after another.

    ``state_dict()`` is ``{"epoch", "offset", "seed", "size", "shuffle"}``. Used alone,
    the offset counts the indices handed out, which is what the loop consumed only for a
    ``DataLoader`` without workers; with workers wrap the loader in
    :class:`ResumableLoader` (then the offset counts what reached the loop).
    """

    __segue_state_dict__ = True  # ctx.checkpoint stores state_dict() (checkpoint._stateful)

    def __init__(self, data: Sized | int, *, shuffle: bool = True, seed: int = 0) -> None:
        size = data if isinstance(data, int) and not isinstance(data, bool) else None
        if size is None:
            if not hasattr(data, "__len__"):
                raise UsageError(f"ResumableSampler needs a dataset with a length, or the number of "
                                 f"records as an int, not a {type(data).__name__}")
            size = len(data)
        if size < 0:
            raise UsageError(f"ResumableSampler needs a number of records >= 0, not {size}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UsageError(f"ResumableSampler's seed must be an int, not {seed!r}")
        self.size, self.shuffle, self.seed = size, bool(shuffle), seed
        self.epoch, self.offset = 0, 0
        # Set by a ResumableLoader: it moves the position as batches reach the loop, and
        # the indices handed out ahead of that must not count.
        self._tracked = False

    def __len__(self) -> int:
        return self.size

    def set_epoch(self, epoch: int) -> None:
        """Go to ``epoch`` from its start; the epoch it is in already keeps its offset, so a
        loop that calls ``set_epoch(e)`` after a restore goes on mid-epoch."""
        if epoch != self.epoch:
            self.epoch, self.offset = int(epoch), 0

    def order(self, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s order of all ``size`` indices (an int64 tensor)."""
        if not self.shuffle:
            return torch.arange(self.size)
        return torch.randperm(self.size, generator=_generator("segue.ResumableSampler", self.seed, epoch))

    def __iter__(self) -> Iterator[int]:
        epoch, start = self.epoch, self.offset
        rest = self.order(epoch)[start:].tolist()  # the skipped records are never read
        if self._tracked:
            yield from rest
            return
        for i, index in enumerate(rest, start + 1):
            self.offset = i  # handed out counts as consumed (true without workers)
            yield index
        self.epoch, self.offset = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed,
                "size": self.size, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from ``state`` (a :meth:`state_dict`); refuses one of another order."""
        said = {k: state.get(k) for k in ("size", "seed", "shuffle")}
        mine = {"size": self.size, "seed": self.seed, "shuffle": self.shuffle}
        if said != mine:
            raise PositionError(f"this ResumableSampler ({mine}) cannot go on from a state of "
                                f"another order ({said}): give it the dataset, seed and shuffle "
                                "it was saved with")
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if not 0 <= offset <= self.size or epoch < 0:
            raise PositionError(f"ResumableSampler state has epoch {epoch} and offset {offset}, "
                                f"outside an order of {self.size} records")
        self.epoch, self.offset = epoch, offset


class ResumableLoader:
    """A ``DataLoader`` over a :class:`ResumableSampler` whose position is what the loop took.

    ``for batch in loader:`` walks what remains of the current epoch, then moves to the
    next one; :attr:`epoch` says which epoch it is in. ``state_dict()`` is the sampler's
    position as of the last batch the loop received, whatever the workers prefetched.
    """

    __segue_state_dict__ = True  # ctx.checkpoint stores state_dict() (checkpoint._stateful)

    def __init__(self, loader: DataLoader) -> None:
        if not isinstance(loader, DataLoader):
            raise UsageError(f"ResumableLoader wraps a torch DataLoader, not a {type(loader).__name__}")
        if isinstance(loader.dataset, IterableDataset):
            raise UsageError("ResumableLoader needs a map-style dataset; an IterableDataset has no "
                             "sampler: use torchdata's StatefulDataLoader with a stateful dataset")
        batches = loader.batch_sampler
        sampler = getattr(batches, "sampler", None) if batches is not None else loader.sampler
        if not isinstance(sampler, ResumableSampler):
            raise UsageError("ResumableLoader needs a DataLoader whose sampler is a ResumableSampler: "
                             "DataLoader(dataset, batch_size=B, sampler=ResumableSampler(dataset, seed=S))")
        if loader.generator is not None:
            raise UsageError("ResumableLoader seeds the DataLoader's workers from the sampler's seed and "
                             "epoch: make the DataLoader without generator=")
        per_batch = 1 if batches is None else getattr(batches, "batch_size", None)
        if not isinstance(per_batch, int) or per_batch < 1:
            raise UsageError("ResumableLoader counts records by the batch sampler's batch_size, and "
                             f"{type(batches).__name__} has none: use batch_size=B or a BatchSampler")
        self.loader, self.sampler, self._per_batch = loader, sampler, per_batch
        sampler._tracked = True

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        """As :meth:`ResumableSampler.set_epoch`."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)  # batches of a whole epoch

    def __iter__(self) -> Iterator[Any]:
        s = self.sampler
        epoch = s.epoch
        # Its own generator, per epoch: the workers' seeds are the same on resume, and
        # torch's global RNG is not drawn from (see the module's docstring).
        self.loader.generator = _generator("segue.ResumableLoader", s.seed, epoch)
        for batch in self.loader:  # the sampler's iterator starts at s.offset
            s.offset = min(s.offset + self._per_batch, s.size)  # the loop has this batch now
            yield batch
        s.epoch, s.offset = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
