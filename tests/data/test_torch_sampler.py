"""ResumableSampler/ResumableLoader, and data loaders stored by a checkpoint as their state_dict().

In process: the kills are tests/integration/test_torch_loaders.py's. Here: a loader in a
state is saved as JSON and raw tensors (no pickle), comes back as a dict that a fresh
loader goes on from with the same batches, and misuse gets one clear line.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from segue.checkpoint import LocalStorage, load, read_manifest, save
from segue.errors import PositionError, UsageError

torch = pytest.importorskip("torch", reason="torch is not installed: pip install 'segue[torch]'")
pytestmark = pytest.mark.torch
from torch.utils.data import DataLoader  # noqa: E402

from segue.data.torch_sampler import ResumableLoader, ResumableSampler  # noqa: E402

# torchdata 0.11 calls a torch API that torch 2.13 deprecated; that is not ours to fix.
SET_VITAL = "ignore:'set_vital' is deprecated:UserWarning"


class Counted(torch.utils.data.Dataset):
    """Records 0..n-1, counting the reads: a resume must not read the skipped records."""

    def __init__(self, n: int) -> None:
        self.n, self.reads = n, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.reads += 1
        return i


def resumable(n: int = 50, workers: int = 2, **kw: Any) -> ResumableLoader:
    data = Counted(n)
    return ResumableLoader(DataLoader(data, batch_size=4, num_workers=workers,
                                      sampler=ResumableSampler(data, seed=3), **kw))


def stateful(n: int = 50) -> Any:
    sdl = pytest.importorskip("torchdata.stateful_dataloader",
                              reason="torchdata is not installed: pip install 'segue[torch]'")
    return sdl.StatefulDataLoader(Counted(n), batch_size=4, shuffle=True, num_workers=2,
                                  generator=torch.Generator().manual_seed(3))


def take(loader: Any, k: int) -> list[list[int]]:
    got: list[list[int]] = []
    while len(got) < k:
        for b in loader:
            got.append(b.tolist())
            if len(got) == k:
                break
    return got


def rest(loader: Any, total: int, done: int) -> list[list[int]]:
    got: list[list[int]] = []
    while done + len(got) < total:
        got += [b.tolist() for b in loader]
    return got


def roundtrip(tmp_path: Path, state: Any) -> Any:
    """Save and load ``state`` without pickle; checks that nothing was stored opaque."""
    storage = LocalStorage(tmp_path / "ck")
    save(storage, "c1", state)
    assert not read_manifest(storage, "c1").opaque  # JSON and raw tensors only
    return load(storage, "c1").state


@pytest.mark.filterwarnings(SET_VITAL)
@pytest.mark.parametrize("make", [resumable, stateful], ids=["resumable", "stateful"])
@pytest.mark.parametrize("cut", [3, 13, 14, 20])  # 13 batches an epoch: 13 is an epoch's last
def test_loader_in_a_checkpoint_goes_on_with_the_same_batches(tmp_path: Path, make: Any,
                                                               cut: int) -> None:
    whole = make()
    expected = take(whole, 39)  # three epochs
    loader = make()
    assert take(loader, cut) == expected[:cut]
    state = roundtrip(tmp_path, {"loader": loader, "step": cut})
    assert isinstance(state["loader"], dict)  # a restore gives the state_dict back
    fresh = make()
    fresh.load_state_dict(state["loader"])
    assert rest(fresh, 39, cut) == expected[cut:]


def test_resumable_state_is_what_the_loop_took_not_what_workers_prefetched(tmp_path: Path) -> None:
    loader = resumable()
    take(loader, 2)  # two workers have prefetched several batches past these by now
    assert loader.state_dict() == {"epoch": 0, "offset": 8, "seed": 3, "size": 50, "shuffle": True}
    assert json.loads(json.dumps(roundtrip(tmp_path, {"s": loader.sampler})["s"])) == \
        loader.state_dict()


def test_resume_reads_no_skipped_record() -> None:
    loader = resumable(workers=0)
    take(loader, 10)
    fresh = resumable(workers=0)
    fresh.load_state_dict(loader.state_dict())
    data = fresh.loader.dataset
    assert len(rest(fresh, 13, 10)) == 3
    assert data.reads == 50 - 40


def test_resumable_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    take(resumable(workers=0), 14)  # across an epoch's end: two iterators started
    assert torch.equal(torch.random.get_rng_state(), before)


def test_sampler_alone_orders_per_seed_and_epoch() -> None:
    s = ResumableSampler(10, seed=1)
    first = list(s)
    assert sorted(first) == list(range(10)) and s.state_dict()["epoch"] == 1
    second = list(s)
    assert second != first
    s.set_epoch(0)
    assert list(s) == first
    other = ResumableSampler(10, seed=2)
    assert list(other) != first
    assert list(ResumableSampler(5, shuffle=False)) == [0, 1, 2, 3, 4]
    s.set_epoch(3)
    it = iter(s)
    head = [next(it), next(it)]
    s.set_epoch(3)  # the epoch it is in already: keeps its offset
    resumed = ResumableSampler(10, seed=1)
    resumed.load_state_dict(s.state_dict())
    assert head + list(resumed) == s.order(3).tolist()


def test_sampler_refuses_a_state_of_another_order() -> None:
    s = ResumableSampler(10, seed=1)
    with pytest.raises(PositionError, match=r"^this ResumableSampler \(.*\) cannot go on from a "
                                            r"state of another order \(.*'seed': 2.*\): give it "
                                            r"the dataset, seed and shuffle it was saved with$"):
        s.load_state_dict(ResumableSampler(10, seed=2).state_dict())
    with pytest.raises(PositionError, match=r"^ResumableSampler state has epoch 0 and offset 11, "
                                            r"outside an order of 10 records$"):
        s.load_state_dict({**s.state_dict(), "offset": 11})


def test_loader_refuses_what_it_cannot_track() -> None:
    data = Counted(8)
    with pytest.raises(UsageError, match=r"^ResumableLoader needs a DataLoader whose sampler is a "
                                         r"ResumableSampler: DataLoader\(.*\)$"):
        ResumableLoader(DataLoader(data, batch_size=2, shuffle=True))
    with pytest.raises(UsageError, match=r"^ResumableLoader seeds the DataLoader's workers .*: "
                                         r"make the DataLoader without generator=$"):
        ResumableLoader(DataLoader(data, batch_size=2, sampler=ResumableSampler(data),
                                   generator=torch.Generator()))
    with pytest.raises(UsageError, match=r"^ResumableLoader wraps a torch DataLoader, not a list$"):
        ResumableLoader([1, 2])  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^ResumableSampler needs a dataset with a length"):
        ResumableSampler(object())  # type: ignore[arg-type]


@pytest.mark.filterwarnings(SET_VITAL)
def test_stateful_loader_without_a_generator_is_warned_about_once(tmp_path: Path) -> None:
    sdl = pytest.importorskip("torchdata.stateful_dataloader",
                              reason="torchdata is not installed: pip install 'segue[torch]'")
    loader = sdl.StatefulDataLoader(Counted(8), batch_size=2, shuffle=True)
    storage = LocalStorage(tmp_path / "ck")
    with pytest.warns(RuntimeWarning, match=r"^a StatefulDataLoader without its own generator .*"
                                            r"pass generator=torch.Generator\(\).manual_seed\(SEED\) "
                                            r"to the loader$"):
        save(storage, "c1", {"loader": loader})
    save(storage, "c2", {"loader": loader})  # once per loader: warnings are errors here
