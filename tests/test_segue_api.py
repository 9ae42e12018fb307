"""The public surface is deliberate: `segue.__all__` is complete and sorted."""

from __future__ import annotations

import types

import segue


def test_all_is_sorted_and_complete() -> None:
    assert segue.__all__ == sorted(segue.__all__)
    # dir(), not vars(): some names are imported on first use (PEP 562), and
    # dir() lists those too.
    public = {name for name in dir(segue)
              if not name.startswith("_") and not isinstance(getattr(segue, name), types.ModuleType)}
    assert public == set(segue.__all__) - {"__version__"}
    for name in segue.__all__:
        assert hasattr(segue, name), name
