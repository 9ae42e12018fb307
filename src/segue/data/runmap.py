"""``run_map``: a data step's entry point, which runs it in this process or over sub-workers.

Apart from ``data.driver`` (the one-process loop) and ``data.coordinator`` (the
loop over N sub-workers, built on the driver) so neither imports the other's
user.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .coordinator import ParallelMapRun
from .driver import READ_BATCH, Limits, MapRun, default_dead_letter, home_dir, input_policy
from .operators import Operator, operator
from .sinks.base import Sink
from .sources.base import Source


def run_map(
    ctx: Any,
    source: Source,
    fn: Callable[..., Any] | Operator,
    sink: Sink,
    *,
    kind: str = "map",
    batch_size: int | None = None,
    batch_bytes: int | None = None,
    dead_letter: Sink | None = None,
    max_failures: int | None = 1000,
    max_failure_rate: float | None = 0.05,
    min_records_for_rate: int = 1000,
    on_input_change: str | None = None,
    read_batch: int = READ_BATCH,
    workers: int | tuple[int, int] = 1,
    min_split: int | None = None,
    recipe: Any = None,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Apply ``fn`` to every record of ``source`` and write the results to ``sink``, exactly once.

    ``kind``: ``map`` (one output per record), ``filter`` (keep records for
    which fn is true), ``flat_map`` (fn returns an iterable), ``map_batches``
    (fn takes and returns a list; batches of ``batch_size`` records or about
    ``batch_bytes`` input bytes). Records whose fn raises go to
    ``dead_letter`` (default: JSONL under HOME/dead-letter/RUN/STEP, HOME the run's home)
    until the limits are passed, then DeadLetterThresholdError.
    ``on_input_change``: ``fail``, ``pin`` or ``include-new``; by default the run's
    stored option, set with ``segue run/resume --on-input-change`` (``fail`` if nothing).
    ``workers``: with N > 1 this process coordinates N sub-worker processes
    over the shards, rebalancing the tail by splitting a lagging shard's
    remainder when it holds more than ``min_split`` units (records or bytes,
    as the shards measure; default 4 read batches or 1 MiB). Sub-workers
    rebuild source, function and sinks from ``recipe`` (set by ``@flow.map``)
    or, in a direct call with ``allow_pickle=True``, from a pickle of them
    (module-level functions, and a sink with ``supports_workers``: the file
    sinks). ``workers=(min, max)`` is elastic: it starts ``min`` sub-workers
    (one per device group it was placed on, when it has devices), adds more
    while shards wait and devices are free, retires idle ones, and gives back a
    sub-worker's devices that a more urgent run was promised (partial
    preemption), each change at a checkpoint barrier. See docs/data.md.
    Returns counters.
    """
    if on_input_change is None:
        on_input_change = input_policy(ctx)
    op = fn if isinstance(fn, Operator) else operator(kind, fn, batch_size=batch_size,
                                                      batch_bytes=batch_bytes)
    if on_input_change not in ("fail", "pin", "include-new"):
        raise ValueError(f"on_input_change must be 'fail', 'pin' or 'include-new', not {on_input_change!r}")
    dead = dead_letter if dead_letter is not None else default_dead_letter(home_dir(ctx), ctx.run_id,
                                                                           ctx.step)
    limits = Limits(max_failures, max_failure_rate, min_records_for_rate)
    from ..errors import FlowError
    from ..flow.model import worker_range

    try:
        low, high = worker_range(workers)
    except FlowError as exc:
        raise ValueError(str(exc).replace("flow.map: ", "")) from None
    if high > 1 and source.queue:
        raise ValueError(f"{type(source).__name__} is read by one process: use workers=1")
    if high > 1:
        return ParallelMapRun(ctx, source, op, sink, dead, limits, on_input_change, read_batch,
                              workers=high, min_workers=low, min_split=min_split, recipe=recipe,
                              allow_pickle=allow_pickle).execute()
    return MapRun(ctx, source, op, sink, dead, limits, on_input_change, read_batch).execute()
