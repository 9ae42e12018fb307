"""The per-batch operators: map, filter, flat_map, map_batches.

An operator turns one unit of input (a batch read from a shard) into output
records plus the failures (input index, record, error). A failing record
never stops the batch: it is set aside for the dead-letter sink, unless the
error is the step's, not the record's (out of memory, a model that cannot
load: :func:`step_error`), which fails the attempt instead. A
``map_batches`` function may also set one record of its batch aside itself by
returning a :class:`Rejected` in its place (a generate handler does, for a
request without a prompt or one too long for its memory budget). Outputs keep
the input order, and ``origins`` says which input record each output came
from (the external-call sink derives idempotency keys from it).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .sources.base import BadRecord

KINDS = ("map", "filter", "flat_map", "map_batches")
_FAILED = object()


class Rejected:
    """An output of a ``map_batches`` function standing for one input record that goes to the
    dead-letter sink with ``reason`` (one line), while the rest of the batch goes on.

    ``record`` is the input record itself (found in the batch by identity), or
    ``index`` says where it sits in the batch the function received.
    """

    __slots__ = ("record", "reason", "index")

    def __init__(self, record: Any, reason: str, index: int | None = None) -> None:
        self.record, self.reason, self.index = record, reason, index

    def __repr__(self) -> str:
        return f"Rejected({self.reason!r})"


@dataclass
class Result:
    outputs: list[Any]
    failures: list[tuple[int, Any, str]] = field(default_factory=list)
    origins: list[tuple[int, int]] | None = None  # (input index, output index within it)


@dataclass(frozen=True)
class Operator:
    """What a data step applies; build one with :func:`operator`."""

    kind: str
    fn: Callable[..., Any]
    batch_size: int | None = None
    batch_bytes: int | None = None

    def apply(self, records: Sequence[Any], has_bad: bool, want_origins: bool) -> Result:
        if self.kind == "map_batches":
            return self._batch(records, has_bad, want_origins)
        res, failures = _each(self.fn, records, has_bad)
        if self.kind == "map":
            outs = res if not failures else [x for x in res if x is not _FAILED]
            origins = [(i, 0) for i, x in enumerate(res) if x is not _FAILED] if want_origins else None
        elif self.kind == "filter":
            keep = [i for i, k in enumerate(res) if k is not _FAILED and k]
            outs = [records[i] for i in keep]
            origins = [(i, 0) for i in keep] if want_origins else None
        else:  # flat_map
            outs, origins = [], [] if want_origins else None
            for i, ys in enumerate(res):
                if ys is _FAILED:
                    continue
                if origins is None:
                    outs.extend(ys)
                else:
                    for j, y in enumerate(ys):
                        outs.append(y)
                        origins.append((i, j))
        return Result(outs, failures, origins)

    def _batch(self, records: Sequence[Any], has_bad: bool, want_origins: bool) -> Result:
        failures: list[tuple[int, Any, str]] = []
        good = list(records)
        if has_bad:
            failures = [(i, r, r.error) for i, r in enumerate(records) if type(r) is BadRecord]
            good = [r for r in records if type(r) is not BadRecord]
        if not good:
            return Result([], failures, [] if want_origins else None)
        try:
            outs = list(self.fn(good))
        except Exception as exc:  # noqa: BLE001 - the whole batch goes to the dead-letter sink
            if step_error(exc):
                raise
            err = f"{type(exc).__name__}: {exc}"
            return Result([], failures + [(i, r, err) for i, r in enumerate(records)
                                          if type(r) is not BadRecord], [] if want_origins else None)
        if any(type(o) is Rejected for o in outs):
            outs = _set_aside(outs, records, good, failures)
        origins = [(0, j) for j in range(len(outs))] if want_origins else None
        return Result(outs, failures, origins)

    def close(self) -> None:
        """Release what the function holds (a model session's model); the attempt ends."""
        close = getattr(self.fn, "close", None)
        if callable(close):
            close()


def _set_aside(outs: list[Any], records: Sequence[Any], good: list[Any],
               failures: list[tuple[int, Any, str]]) -> list[Any]:
    """Move the :class:`Rejected` outputs into ``failures`` (at their record's index in
    ``records``, in order); the other outputs, in order."""
    where = {id(r): i for i, r in enumerate(records)}
    kept = []
    for o in outs:
        if type(o) is not Rejected:
            kept.append(o)
            continue
        i = where.get(id(o.record))
        if i is None and o.index is not None and 0 <= o.index < len(good):
            i = where.get(id(good[o.index]), o.index)
        failures.append((i if i is not None else 0, o.record, o.reason))
    failures.sort(key=lambda f: f[0])
    return kept


def step_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the step's failure rather than one record's: out of memory (host
    or device), or an error marked ``segue_fatal`` (a model that cannot load). The
    attempt fails and retries from its checkpoint; no record is dead-lettered for it."""
    return (isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
            or bool(getattr(exc, "segue_fatal", False)))


def _each(fn: Callable[[Any], Any], records: Sequence[Any], has_bad: bool) -> tuple[list[Any], list]:
    """fn over records, 1:1, with _FAILED where it raised (the fast path has no per-record try)."""
    res: list[Any] = []
    failures: list[tuple[int, Any, str]] = []
    append = res.append
    n = len(records)
    while len(res) < n:
        try:
            if has_bad:
                for r in records[len(res):]:
                    if type(r) is BadRecord:
                        failures.append((len(res), r, r.error))
                        append(_FAILED)
                    else:
                        append(fn(r))
            else:
                for r in records[len(res):] if res else records:
                    append(fn(r))
        except Exception as exc:  # noqa: BLE001 - a bad record goes to the dead-letter sink
            if step_error(exc):
                raise
            failures.append((len(res), records[len(res)], f"{type(exc).__name__}: {exc}"))
            append(_FAILED)
    return res, failures


def operator(kind: str, fn: Callable[..., Any], *, batch_size: int | None = None,
             batch_bytes: int | None = None) -> Operator:
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind != "map_batches" and (batch_size or batch_bytes):
        raise ValueError("batch_size and batch_bytes apply to kind='map_batches' only")
    if kind == "map_batches" and not (batch_size or batch_bytes):
        batch_size = 1024
    return Operator(kind, fn, batch_size, batch_bytes)


def record_bytes(records: Sequence[Any]) -> int:
    """An estimate of records' size for byte-bounded batches when the source cannot tell."""
    return sum(len(json.dumps(r, default=str)) + 1 for r in records)
