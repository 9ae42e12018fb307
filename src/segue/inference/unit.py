"""UnitState: what a handler keeps of one batch in flight, so a checkpoint can cut it.

A data step commits between batches. A generate handler's batch can take
minutes, so it may also offer a checkpoint between tokens: the data driver
(``segue.data.driver``, through :meth:`ModelSession.segue_begin_unit`) gives
each batch a :class:`UnitState` holding what a previous attempt saved of that
same batch (``resumed``) and an ``offer`` that commits a checkpoint, with
:attr:`UnitState.saved` as the batch's partial state, when one is due. The
state is plain JSON keyed by request id, so it survives any process.
``home`` is the run's home directory (where a handler finds its measured
profile), or None outside a step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class UnitState:
    """The partial state of the batch in flight: ``{request id: what the handler saved}``."""

    __slots__ = ("resumed", "saved", "_offer", "home")

    def __init__(self, resumed: Mapping[str, Any] | None, offer: Callable[[dict[str, Any]], None] | None,
                 home: str | None = None) -> None:
        self.resumed: dict[str, Any] = dict(resumed or {})
        self.saved: dict[str, Any] = dict(self.resumed)
        self._offer = offer
        self.home = home

    def get(self, rid: str) -> Any | None:
        """What a previous attempt saved for request ``rid`` of this batch, if anything."""
        return self.resumed.get(rid)

    def update(self, entries: Mapping[str, Any]) -> None:
        self.saved.update(entries)

    def offer(self) -> None:
        """Commit a checkpoint holding :attr:`saved` now, if one is due (a pause parks here)."""
        if self._offer is not None:
            self._offer(dict(self.saved))
