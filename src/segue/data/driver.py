"""run_map: a resumable, exactly-once map step over a source into a sink.

Uses only the public StepContext API. The loop is::

    state = ctx.restore()                  # position, sink state, pinned snapshot
    sink.open(scope, state["sink"])        # roll forward / roll back (two-phase commit)
    for each shard from the cursor, for each batch from the position:
        outputs = operator(batch); sink.write(outputs)
        if ctx.checkpoint_due(records):
            sink.stage()                   # durable under (run, step, epoch, part) names
            ctx.checkpoint(state, durable=True)  # THE commit point
            sink.publish()                 # rename into place; redone by recovery if we die here

A SIGKILL before the commit loses only staged leftovers (deleted on
recovery); after it, recovery publishes what the checkpoint names. A pause
raises Park from ctx.checkpoint *after* the commit, so the covered output is
published before unwinding. A stale epoch raises FencedError at the commit
(store) or at the publish (sink fences): nothing is published.

The state is O(1) in the input size except for the pinned snapshot, which is
O(number of input files): a shard index plus a source position, counters and
the sink's pending staged parts (those since the previous checkpoint).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .._park import Park
from .errors import DeadLetterThresholdError, IncompleteInputError
from .operators import Operator, record_bytes
from .sinks.base import Scope, Sink
from .sinks.files import JsonlSink
from .sources.base import BadRecord, Batch, Position, Shard, Source

log = logging.getLogger("segue.data")

STATE_VERSION = 1
READ_BATCH = 512
STATS = ("records_in", "records_out", "failures", "bytes_in", "restarts", "records_retried")
VOLATILE = ("restarts", "records_retried")  # differ between a clean and an interrupted run
# A queue source's lag, logged as the step metrics queue_NAME (sources.queue.QueueSource.lag).
QUEUE_METRICS = ("pending", "undelivered", "oldest_age_s", "keeps_s", "at")


@dataclass(frozen=True)
class Limits:
    """When bad records stop the step: more than ``max_failures`` in all, or a
    failure rate above ``max_failure_rate`` once ``min_records`` were read."""

    max_failures: int | None = 1000
    max_failure_rate: float | None = 0.05
    min_records: int = 1000


def home_dir(ctx: Any) -> str:
    """The run's home directory, as the step context knows it.

    A real StepContext carries the home the worker was started with (``segue
    --home X`` included), so dead letters land there whatever the working
    directory. Only a bare test double without one falls back to the default
    resolution ($SEGUE_HOME, else ./.segue).
    """
    home = getattr(ctx, "home", None)
    if home is None:
        return os.path.abspath(os.environ.get("SEGUE_HOME", ".segue"))
    return os.fspath(getattr(home, "root", home))


def store_of(ctx: Any) -> str | None:
    """The store the run's home was given explicitly (``Home.store``), for the processes
    the step starts (its sub-workers); None: the home's own choice."""
    return getattr(getattr(ctx, "home", None), "store", None)


def default_dead_letter(home: str, run_id: str, step: str) -> JsonlSink:
    """``HOME/dead-letter/RUN/STEP`` (dead-*.jsonl parts); ``home`` from :func:`home_dir`."""
    return JsonlSink(os.path.join(home, "dead-letter", run_id, step), prefix="dead-")


def input_policy(ctx: Any) -> str:
    """The run's stored ``on_input_change`` option (segue.run.options); ``fail`` if none."""
    options = getattr(ctx, "options", None) or {}
    return str(options.get("on_input_change", "fail"))


class _Unit:
    """One operator input: consecutive batches of one shard (several for byte-bounded batches)."""

    __slots__ = ("records", "position", "nbytes", "has_bad", "flush", "first_ordinal", "start")

    def __init__(self, batches: list[Batch], first_ordinal: int, start: Position) -> None:
        if len(batches) == 1:
            self.records = batches[0].records
        else:
            self.records = [r for b in batches for r in b.records]
        self.position = batches[-1].position
        self.nbytes = sum(b.nbytes for b in batches)
        self.has_bad = any(b.has_bad for b in batches)
        self.flush = batches[-1].flush
        self.first_ordinal = first_ordinal
        self.start = start


def effective_read_batch(op: Operator, read_batch: int) -> int:
    """Records per source read: map_batches by count reads whole batches."""
    if op.kind == "map_batches" and op.batch_size and not op.batch_bytes:
        return op.batch_size
    if op.kind == "map_batches":
        return 64
    return read_batch


def iter_units(op: Operator, shard: Shard, position: Position, read_batch: int) -> Iterator[_Unit]:
    """The operator inputs of ``shard`` from ``position``, each ending at a batch boundary."""
    ordinal = int(position.get("records", 0))
    if op.kind != "map_batches" or not op.batch_bytes:
        for b in shard.read(position, read_batch):
            yield _Unit([b], ordinal, position)
            ordinal, position = int(b.position.get("records", 0)), b.position
        return
    acc: list[Batch] = []
    size = 0
    for b in shard.read(position, read_batch):
        acc.append(b)
        size += b.nbytes or record_bytes(b.records)
        if size >= op.batch_bytes or b.flush:  # a flush cannot wait for a full unit
            yield _Unit(acc, ordinal, position)
            ordinal, position, acc, size = int(b.position.get("records", 0)), b.position, [], 0
    if acc:
        yield _Unit(acc, ordinal, position)


def dead_rows(shard: Shard, unit: _Unit, failures: list[tuple[int, Any, str]]) -> list[dict[str, Any]]:
    """Dead-letter rows (error, shard, ordinal, the record or its raw text) for failed records."""
    rows = []
    for idx, rec, err in failures:
        body = {"raw": rec.raw} if type(rec) is BadRecord else {"record": json.loads(json.dumps(rec, default=str))}
        rows.append({"error": err, "shard": shard.key, "ordinal": unit.first_ordinal + idx,
                     "batch_start": unit.start, **body})
    return rows


class MapRun:
    """One attempt of a data step. Build with :func:`run_map`."""

    def __init__(self, ctx: Any, source: Source, op: Operator, sink: Sink, dead: Sink,
                 limits: Limits, on_input_change: str, read_batch: int) -> None:
        self.ctx, self.source, self.op, self.sink, self.dead = ctx, source, op, sink, dead
        self.limits, self.policy = limits, on_input_change
        self.read_batch = effective_read_batch(op, read_batch)
        self.stats = dict.fromkeys(STATS, 0)
        self.t0 = time.monotonic()
        self.attempt_records = 0
        self.last_error = ""
        self._tail: Position | None = None  # the position after the last unit read

    # -- recovery ---------------------------------------------------------------
    def _restore(self) -> dict[str, Any] | None:
        state = self.ctx.restore()
        if state is not None and state.get("v") != STATE_VERSION:
            raise ValueError(f"data step state version {state.get('v')!r} is not {STATE_VERSION}; "
                             f"this segue cannot resume it")
        if state is not None and state.get("mode") == "parallel":
            raise ValueError(f"step {self.ctx.step!r} was checkpointed with workers={state.get('workers')}; "
                             f"resume it with the same workers= setting")
        now = self.source.snapshot()
        # The in-flight state of the unit the cursor points into (a generation cut mid-batch).
        self.unit_partial = None if state is None else state.get("unit")
        if state is None:
            self.pin = now
            self.cursor: dict[str, Any] = {"shard": 0, "position": None}
        else:
            self.pin = self.source.pinned(state["pin"], now, self.policy, self.ctx.step)
            self.cursor = state["cursor"]
            self.stats.update(state["stats"])
            self.stats["restarts"] += 1
        self.shards: list[Shard] = self.source.shards(self.pin)
        sizes = [s.size() for s in self.shards]
        self.unit = sizes[0][1] if sizes else "records"
        self.total = None if any(n is None for n, _ in sizes) else sum(n or 0 for n, _ in sizes)
        self.before = [0]
        for n, _ in sizes:
            self.before.append(self.before[-1] + (n or 0))
        if state is not None:
            self._count_retried()
        scope = Scope(self.ctx.run_id, self.ctx.step, self.ctx.epoch)
        self.source.attach(scope)
        self.sink.open(scope, None if state is None else state["sink"])
        self.dead.open(scope, None if state is None else state["dead"])
        if state is not None:  # rolled forward above: a queue acks what the checkpoint covers
            self.source.after_commit(self.cursor["position"])
        return state

    def _queue_report(self) -> None:
        """A queue's lag as step metrics (one point per name, replaced at each report;
        `segue status` reads them) and its warnings (a pause past what the broker
        keeps) as ``warning`` events of the run."""
        src: Any = self.source
        for message in src.take_warnings():
            record = getattr(self.ctx, "record_event", None)
            if record is not None:
                record("warning", f"step {self.ctx.step}: {message}", data={"queue": src.kind})
        src.lag_due()
        lag = src.take_lag()
        log_metrics = getattr(self.ctx, "log_metrics", None)
        if lag is None or log_metrics is None:
            return
        nan = float("nan")  # stored as null: the broker does not say
        log_metrics(0, **{f"queue_{k}": nan if lag.get(k) is None else float(lag[k])
                          for k in QUEUE_METRICS})

    def _count_retried(self) -> None:
        """Estimate the records the lost attempt processed past the restored checkpoint.

        The previous attempt's last reported progress (flushed by its heartbeat)
        minus the committed position is work that is now done again.
        """
        prev = getattr(self.ctx, "previous_progress", None)
        if not prev or prev[0] is None:
            return
        lost_units = max(0.0, float(prev[0]) - self._done(self.cursor["shard"], self.cursor["position"]))
        per_record = 1.0
        if self.unit == "bytes" and self.stats["records_in"]:
            per_record = self.stats["bytes_in"] / self.stats["records_in"]
        self.stats["records_retried"] += int(lost_units / max(per_record, 1e-9))

    # -- the loop ---------------------------------------------------------------
    def execute(self) -> dict[str, Any]:
        try:
            state = self._restore()
            if state is None or not state.get("done"):
                self._loop()
                self._check_read_all()
                # A queue's last position names the messages the final commit covers.
                self._commit(len(self.shards), self._tail if self.source.queue else None, done=True)
            self.sink.finish()
            self.dead.finish()
            return self.summary()
        finally:
            self.op.close()  # a model gives its device back before the attempt parks or ends
            self.sink.close()
            self.dead.close()
            self.source.close()

    def _units(self, shard: Shard, position: Position) -> Iterator[_Unit]:
        return iter_units(self.op, shard, position, self.read_batch)

    def _loop(self) -> None:
        ctx, stats, sink = self.ctx, self.stats, self.sink
        want_keys = sink.needs_keys
        i = int(self.cursor["shard"])
        pos = self.cursor["position"]
        begin = getattr(self.op.fn, "segue_begin_unit", None)  # a model session (inference layer)
        while i < len(self.shards):
            shard = self.shards[i]
            pos = pos if pos is not None else shard.start()
            for unit in self._units(shard, pos):
                if begin is not None:
                    partial, self.unit_partial = self.unit_partial, None  # only the first unit resumes
                    begin(partial, functools.partial(self._offer_mid_unit, i, unit.start))
                res = self.op.apply(unit.records, unit.has_bad, want_keys)
                if res.outputs:
                    keys = None
                    if want_keys and res.origins is not None:
                        o, k = unit.first_ordinal, shard.key
                        keys = [f"{k}:{o + a}:{b}" for a, b in res.origins]
                    sink.write(res.outputs, shard.key, keys)
                n = len(unit.records)
                stats["records_in"] += n
                stats["records_out"] += len(res.outputs)
                stats["bytes_in"] += unit.nbytes
                self.attempt_records += n
                pos = self._tail = unit.position
                if res.failures:
                    self._dead_letter(shard, unit, res.failures)
                ctx.progress(self._done(i, pos), self.total)
                if ctx.checkpoint_due(stats["records_in"]) or unit.flush:
                    self._commit(i, pos)
                if self.source.queue:
                    self._queue_report()
            i += 1
            pos = None

    def _dead_letter(self, shard: Shard, unit: _Unit, failures: list[tuple[int, Any, str]]) -> None:
        rows = dead_rows(shard, unit, failures)
        self.dead.write(rows, shard.key, [f"{shard.key}:{r['ordinal']}" for r in rows])
        self.stats["failures"] += len(rows)
        self.last_error = failures[-1][2]
        log.warning("step %s: %d record(s) failed in shard %s (last: %s)", self.ctx.step, len(rows),
                    shard.key, self.last_error)
        self._check_limits()

    def _check_limits(self) -> None:
        lim, f, n = self.limits, self.stats["failures"], self.stats["records_in"]
        why = None
        if lim.max_failures is not None and f > lim.max_failures:
            why = f"more than max_failures={lim.max_failures}"
        elif lim.max_failure_rate is not None and n >= lim.min_records and f / n > lim.max_failure_rate:
            why = f"rate {f / n:.3g} above max_failure_rate={lim.max_failure_rate}"
        if why:
            # Nothing of the current batch is committed: a resume with a fixed
            # function processes these records again.
            raise DeadLetterThresholdError(self.ctx.step, f, n, f"{why}; last error: {self.last_error}",
                                           self.dead.describe())

    def _check_read_all(self) -> None:
        """Refuse to end the step short of its input: the last checkpoint would say done.

        Every shard's units (bytes or records) are counted as they are read, and
        a resume restores the count with the position, so at the end the count
        equals the input's size (a JSONL shard may read past its end into the
        next one, which then skips as much: only a shortfall is a loss).
        """
        if self.total is None:
            return  # a source that cannot size its shards (SQL): its cursor walked them all
        read = self.stats["bytes_in"] if self.unit == "bytes" else self.stats["records_in"]
        if read < self.total:
            raise IncompleteInputError(self.ctx.step, self.unit, read, self.total)

    # -- commit -----------------------------------------------------------------
    def _offer_mid_unit(self, shard_index: int, start: Position, partial: Any) -> None:
        """Checkpoint inside a unit when one is due (or a pause waits): the function's
        ``partial`` state (a long generation's tokens so far) with the cursor at the
        unit's start, so the next attempt reads the same unit again and resumes it."""
        if not self.ctx.checkpoint_due(self.stats["records_in"]):
            return
        try:
            self._commit(shard_index, start, unit=partial)
        except Exception as exc:
            # The step's own failure (fenced, storage): the operator must re-raise it,
            # not dead-letter the unit's records for it.
            exc.segue_fatal = True  # type: ignore[attr-defined]
            raise

    def _commit(self, shard_index: int, position: Position | None, done: bool = False,
                unit: Any = None) -> None:
        self.sink.stage()
        self.dead.stage()
        state = {
            "v": STATE_VERSION,
            "pin": self.pin,
            "cursor": {"shard": shard_index, "position": position},
            "sink": self.sink.state(),
            "dead": self.dead.state(),
            "stats": dict(self.stats),
            "done": done,
        }
        if unit is not None:
            state["unit"] = unit
        done_units = self.total if done and self.total is not None else self._done(shard_index, position)
        self.ctx.progress(done_units, self.total)
        try:
            self.ctx.checkpoint(state, position=self._position(shard_index, done_units), durable=True)
        except Park:
            self._publish()  # the checkpoint committed before Park was raised
            self.source.after_commit(position)  # a parked queue step has acked what it published
            raise
        self._publish()
        self.source.after_commit(position)

    def _publish(self) -> None:
        self.sink.publish()
        self.dead.publish()

    # -- progress ---------------------------------------------------------------
    def _done(self, i: int, position: Position | None) -> float:
        if i >= len(self.shards):
            return float(self.before[-1])
        within = 0 if position is None else self.shards[i].done(position)
        return float(self.before[i] + within)

    def _position(self, i: int, done: float) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.t0, 1e-9)
        rate = self.attempt_records / elapsed
        eta = None
        if self.total is not None and done > 0 and self.attempt_records:
            unit_rate = rate * (self.stats["bytes_in"] / max(self.stats["records_in"], 1)
                                if self.unit == "bytes" else 1.0)
            eta = round((self.total - done) / unit_rate, 1) if unit_rate > 0 else None
        shard = self.shards[i].key if i < len(self.shards) else None
        queue = {"queue": getattr(self.source, "last_lag", None) or {}} if self.source.queue else {}
        return {"shard": shard, "shard_index": i, "shards": len(self.shards), "unit": self.unit,
                "done": done, "total": self.total, "rate_rps": round(rate, 1), "eta_s": eta,
                **self.stats, **queue}

    def summary(self) -> dict[str, Any]:
        # Only what a clean and an interrupted run agree on: restarts are in the
        # checkpoint position (and `segue status`), not in the step's output.
        stats = {k: v for k, v in self.stats.items() if k not in VOLATILE}
        return {**stats, "shards": len(self.shards), "sink": self.sink.describe(),
                "dead_letter": self.dead.describe()}
