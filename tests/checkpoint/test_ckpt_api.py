"""The public surface of segue.checkpoint is deliberate: complete and sorted."""

from __future__ import annotations

import types

import segue.checkpoint as ckpt


def test_all_is_sorted_and_complete() -> None:
    assert ckpt.__all__ == sorted(ckpt.__all__)
    public = {
        name
        for name, value in vars(ckpt).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public == set(ckpt.__all__)
