"""Objects a checkpoint stores through their ``state_dict()``: data loaders and samplers.

A torchdata ``StatefulDataLoader`` or a segue ``ResumableSampler``/``ResumableLoader``
put in a state tree is saved as what its ``state_dict()`` returns (dicts, ints and a
generator's ByteTensor: JSON and raw tensors, never pickle); a restore gives back that
dict, for the live object's ``load_state_dict``, as with a model or an optimizer.

Only these kinds: a module or an optimizer in a state is pickled with
``allow_pickle=True`` today, and must stay so. torch is never imported here.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from typing import Any

MARKER = "__segue_state_dict__"
"""A class attribute, True on classes whose ``state_dict()`` is their checkpoint."""

_warned: weakref.WeakSet[Any] = weakref.WeakSet()  # warned once each, not at every checkpoint


def state_of(value: Any) -> Any | None:
    """``value.state_dict()`` if ``value`` is saved that way, else None."""
    if getattr(type(value), MARKER, False) is True:
        return value.state_dict()
    mod = sys.modules.get("torchdata.stateful_dataloader")
    if mod is not None and isinstance(value, mod.StatefulDataLoader):
        _warn_global_rng(value)
        return value.state_dict()
    return None


def _warn_global_rng(loader: Any) -> None:
    if loader.generator is not None or loader in _warned:
        return
    _warned.add(loader)
    warnings.warn(
        "a StatefulDataLoader without its own generator draws its seeds from torch's global "
        "RNG each time its iterator starts, which a resumed attempt does at another point: "
        "dropout and other random ops then differ from an uninterrupted run; pass "
        "generator=torch.Generator().manual_seed(SEED) to the loader",
        RuntimeWarning,
        stacklevel=2,
    )
