"""Helpers shared by the checkpoint tests."""

from __future__ import annotations

import numpy as np


def assert_same(a: object, b: object, path: str = "state") -> None:
    """Exact equality: same types (tuple stays tuple), dtypes, shapes and bits (nan too)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert a.tobytes() == b.tobytes(), path
    elif isinstance(a, np.generic):
        assert isinstance(b, np.generic)
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), path
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert list(a) == list(b), f"{path}: keys or their order differ"
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple)
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float)
        assert (a != a and b != b) or repr(a) == repr(b), f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
