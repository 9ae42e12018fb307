"""The public surface is deliberate: `segue.__all__` is complete and sorted."""

from __future__ import annotations

import types

import segue


def test_all_is_sorted_and_complete() -> None:
    assert segue.__all__ == sorted(segue.__all__)
    public = {name for name, value in vars(segue).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public == set(segue.__all__) - {"__version__"}
    for name in segue.__all__:
        assert hasattr(segue, name), name
