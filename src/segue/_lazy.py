"""NumPy on first use, for modules that need it only when a state holds arrays.

A data step's state is JSON: its worker never needs NumPy, whose import costs
about 0.15 s of every worker start (and of every resume) on a small machine. A
module declares ``np = numpy_on_first_use(globals())``; the first attribute read
imports NumPy and rebinds the module's ``np`` to it, so later reads cost nothing
extra. Code that only *checks* for NumPy types reads ``sys.modules`` instead: a
value of a NumPy type means NumPy is already imported.
"""

from __future__ import annotations

from typing import Any


class _FirstUse:
    __slots__ = ("_owner",)

    def __init__(self, owner: dict[str, Any]) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        import numpy

        self._owner["np"] = numpy
        return getattr(numpy, name)


def numpy_on_first_use(module_globals: dict[str, Any]) -> Any:
    return _FirstUse(module_globals)
