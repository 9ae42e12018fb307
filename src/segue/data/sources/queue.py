"""What the message-queue sources share: one shard, no input pinning, the drain rule, decoding.

A queue (a Redis stream, a RabbitMQ queue) is unbounded by nature: its
snapshot names it and nothing else, new messages are never an input change,
and it is one shard read by one process (``workers=1``). The subclasses own
the broker: how a read happens, what the position names, how an ack works
(:meth:`Source.after_commit`, never before the covering commit).

:class:`Drain` is the rule that ends a read in drain mode (a number of
messages, empty reads in a row, or an idle time on a clock); with all three
None the step reads until it is paused or cancelled. :class:`IdLedger` is
what a broker that acknowledges only by delivery tag keeps in the position
instead: the message ids read since the last ack and of the last outputs
published, so a redelivered message already published is dropped.

Two things every queue reports to the step, without the reader ever
connecting to the broker itself:

* **Lag** (:meth:`QueueSource.lag`): messages delivered and not acknowledged
  (``pending``), messages not delivered yet (``undelivered``) and the oldest
  unacknowledged message's age, measured at most every ``lag_every_s``
  between batches (:meth:`QueueSource.lag_due`). The map step logs the figure
  as step metrics (``queue_*``, one point each, replaced at every report) and
  names it in its checkpoints' positions; ``segue status`` shows it.
* **What the broker keeps** (``keeps_s`` in the lag: stream trimming, a queue's
  message TTL, a subscription's retention) and, when a restored position is
  older than that or the broker shows it dropped unread messages, a warning with
  both figures (:meth:`QueueSource.warn`; the map step records it as a
  ``warning`` event of the run). A stop never turns into a silent loss.
"""

from __future__ import annotations

import json
import logging
import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import PositionError
from .base import BadRecord, Batch, Position, Shard, Source

log = logging.getLogger("segue.data.sources.queue")
LAG_EVERY_S = 5.0  # how often a reading step measures its lag (a round trip or two)


@dataclass
class QueueShard(Shard):
    source: QueueSource = field(repr=False, compare=False)
    key: str = "00000"

    def start(self) -> Position:
        return self.source.start_position()

    def read(self, position: Position, batch: int = 512) -> Iterator[Batch]:
        # What ``position`` covers was acknowledged by after_commit at restore.
        return self.source.read_from(position, batch)

    def split(self, position: Position) -> None:
        return None  # one reader per step: nothing to hand to another one

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.source.shard_kind, "key": self.key}


class QueueSource(Source):
    """A message queue: one shard, never pinned; subclasses read and acknowledge.

    The keywords every queue takes: the drain rule (see :class:`Drain`; each
    empty read waits up to ``block_ms``) and ``max_deliveries``, past which a
    message is poison.
    """

    queue = True
    shard_kind = "queue"

    def __init__(
        self,
        *,
        block_ms: int,
        drain_idle_s: float | None,
        drain_after_empty_reads: int | None,
        max_messages: int | None,
        max_deliveries: int,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
        lag_every_s: float = LAG_EVERY_S,
    ) -> None:
        if max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, not {max_deliveries}")
        self.block_ms, self.drain_idle_s = int(block_ms), drain_idle_s
        self.drain_after_empty_reads, self.max_messages = drain_after_empty_reads, max_messages
        self.max_deliveries, self.clock = int(max_deliveries), clock
        self.wall, self.lag_every_s = wall, float(lag_every_s)
        self.last_lag: dict[str, Any] | None = None  # the newest lag figure measured
        self._lag_next = 0.0  # time.monotonic() of the next measurement
        self._lag_fresh = False
        self._warnings: list[str] = []

    # -- lag and retention -------------------------------------------------------
    def lag(self) -> dict[str, Any]:
        """The queue's lag now, for this step's group or subscription (a round trip or
        two to the broker; the subclass's). Keys, each None where the broker does not
        say: ``pending`` (delivered, not acknowledged), ``undelivered``,
        ``oldest_age_s`` (the oldest unacknowledged message), ``keeps_s`` (how long the
        broker keeps a message nobody acknowledged: a TTL, a retention, the age of a
        trimmed stream's oldest entry), ``keeps`` (that figure in words) and ``note``
        (what is not available, and why)."""
        return {}

    def lag_due(self, force: bool = False) -> dict[str, Any] | None:
        """A new lag figure (with ``at``, the wall time it was measured) when one is due
        (every ``lag_every_s``, or ``force``), else None. A broker that fails to answer
        costs nothing here: the read itself will say so."""
        now = time.monotonic()
        if not force and now < self._lag_next:
            return None
        self._lag_next = now + self.lag_every_s
        try:
            figure = {"pending": None, "undelivered": None, "oldest_age_s": None,
                      "keeps_s": None, **self.lag(), "at": round(self.wall(), 3)}
        except Exception as exc:  # noqa: BLE001 - a report, never the step's failure
            log.debug("%s %s: measuring the lag failed: %s", self.kind, self.input_name, exc)
            return None
        self.last_lag, self._lag_fresh = figure, True
        return figure

    def take_lag(self) -> dict[str, Any] | None:
        """The newest figure if nobody took it yet (the map step logs each one once)."""
        if not self._lag_fresh:
            return None
        self._lag_fresh = False
        return self.last_lag

    def warn(self, message: str) -> None:
        """A warning for the run's history (the map step records it as an event)."""
        logging.getLogger(type(self).__module__).warning("%s", message)
        self._warnings.append(message)

    def take_warnings(self) -> list[str]:
        got, self._warnings = self._warnings, []
        return got

    def stopped_for(self, position: Position | None) -> float | None:
        """How long ago ``position`` was read (its ``at``), or None where it has none."""
        at = None if position is None else position.get("at")
        return None if at is None else max(0.0, self.wall() - float(at))

    def drain(self) -> Drain:
        """A fresh drain rule for one read (its idle time starts now)."""
        return Drain(self.max_messages, self.drain_after_empty_reads, self.drain_idle_s, self.clock)

    @property
    @abstractmethod
    def input_name(self) -> str:
        """The stream or queue this source reads (its snapshot's only item)."""

    @abstractmethod
    def start_position(self) -> Position:
        """The position before any message was read."""

    @abstractmethod
    def read_from(self, position: Position, batch: int) -> Iterator[Batch]:
        """Batches from ``position`` (restored: what it covers is already acknowledged)."""

    def snapshot(self) -> dict[str, Any]:
        return {"kind": self.kind, "items": {self.input_name: {}}}

    def pinned(
        self, snapshot: dict[str, Any], now: dict[str, Any], policy: str, step: str = "?"
    ) -> dict[str, Any]:
        return now  # a queue is unbounded by nature: new messages are never an input change

    def shards(self, snapshot: dict[str, Any]) -> list[Shard]:
        return [QueueShard(self)]

    def shard_from_json(self, data: dict[str, Any]) -> Shard:
        if data.get("kind") != self.shard_kind:
            raise PositionError(f"shard {data!r} is not a {self.shard_kind} shard")
        return QueueShard(self, data["key"])


class Drain:
    """When a drain-mode read is over: after ``max_messages`` in all, after
    ``after_empty_reads`` empty reads in a row, or once nothing arrived for
    ``idle_s`` seconds of ``clock``. All three None: never (continuous)."""

    def __init__(
        self,
        max_messages: int | None,
        after_empty_reads: int | None,
        idle_s: float | None,
        clock: Callable[[], float],
    ) -> None:
        self.max_messages, self.after_empty_reads, self.idle_s = (
            max_messages,
            after_empty_reads,
            idle_s,
        )
        self.clock = clock
        self.empties, self.idle_since = 0, clock()

    def room(self, done: int, batch: int) -> int:
        """How many more messages a read may take (0: max_messages reached)."""
        if self.max_messages is None:
            return batch
        return max(0, min(batch, self.max_messages - done))

    def arrived(self) -> None:
        self.empties, self.idle_since = 0, self.clock()

    def empty_read(self) -> bool:
        """Count an empty read; True when the drain condition holds."""
        self.empties += 1
        if self.after_empty_reads is not None and self.empties >= self.after_empty_reads:
            return True
        return self.idle_s is not None and self.clock() - self.idle_since >= self.idle_s


def span(seconds: float) -> str:
    """``seconds`` as the largest sensible unit: 45 s, 12.5 min, 3.2 h, 7.0 days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def poison(raw: str, what: str, deliveries: int, max_deliveries: int) -> BadRecord:
    """The bad record of a message delivered more than ``max_deliveries`` times."""
    return BadRecord(
        raw,
        f"{what} was delivered {deliveries} times, more than max_deliveries={max_deliveries}",
    )


def decode_json(text: str, what: str) -> Any:
    """The JSON value of ``text``, or a :class:`BadRecord` saying ``what`` is not valid JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:
        return BadRecord(text, f"{what} is not valid JSON ({exc})")


def with_id(rec: Any, id_key: str | None, mid: str) -> Any:
    """``rec`` with the message id under ``id_key`` (a dict record only; None: as it is)."""
    return {**rec, id_key: mid} if id_key is not None and isinstance(rec, dict) else rec


def body_record(mid: str, body: bytes, deliveries: int, max_deliveries: int, *, raw_key: str,
                id_key: str | None) -> Any:
    """A message's body as its record (UTF-8 JSON, :func:`with_id`), or the bad record that
    dead-letters it: not UTF-8, delivered more than ``max_deliveries`` times (the raw line
    holds the body under ``raw_key``), or not JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return BadRecord(body.decode("utf-8", "replace"), f"message {mid} is not UTF-8 ({exc})")
    if deliveries > max_deliveries:
        return poison(json.dumps({"id": mid, raw_key: text}), f"message {mid}", deliveries, max_deliveries)
    return with_id(decode_json(text, f"message {mid}"), id_key, mid)


class IdLedger:
    """What a queue that cannot acknowledge by id keeps in its position (RabbitMQ's delivery
    tags, for one, die with their channel): message ids, bounded, never the input.

    * ``window``: the ids read since the last ack (bounded by the prefetch);
    * ``ids``: the ledger, the ids of the last ``size`` messages whose outputs were
      published; a redelivered message found there is dropped, not processed;
    * ``counts``: deliveries of redelivered messages, where the broker counts none.

    ``fields()`` goes into every position; :meth:`load` merges a committed one
    (its window's outputs are published) and is idempotent. The ledger list is
    replaced, never mutated, so positions already handed out stay as they were.
    """

    def __init__(self, size: int) -> None:
        self.size = int(size)
        self.ids: list[str] = []
        self._ids: set[str] = set()
        self.window: list[str] = []
        self._window: set[str] = set()
        self.counts: dict[str, int] = {}

    def published(self, mid: str) -> bool:
        return mid in self._ids

    def seen(self, mid: str) -> bool:
        """Published, or read since the last ack (a producer that sent it twice)."""
        return mid in self._ids or mid in self._window

    def read(self, mid: str) -> None:
        self.window.append(mid)
        self._window.add(mid)

    def redelivered(self, mid: str) -> int:
        """Count one more delivery of ``mid``; the total (the first one included)."""
        self.counts[mid] = self.counts.get(mid, 1) + 1
        return self.counts[mid]

    def restart(self) -> None:
        """A new attempt's channel: nothing read on it yet."""
        self.window, self._window = [], set()

    def fields(self) -> dict[str, Any]:
        return {"window": list(self.window), "ledger": self.ids, "counts": dict(self.counts)}

    def load(self, position: Position) -> None:
        """Merge ``position``'s ledger and window (published) into ours; drop what it covers
        from our window and counts."""
        window = list(position.get("window") or ())
        base = position.get("ledger") or []
        if window or base is not self.ids:
            merged = list(dict.fromkeys([*self.ids, *base, *window]))[-self.size :]
            self.ids, self._ids = merged, set(merged)
        counts = {**(position.get("counts") or {}), **self.counts}
        self.counts = {k: v for k, v in counts.items() if k not in self._ids}
        if window:
            covered = set(window)
            self.window = [i for i in self.window if i not in covered]
            self._window = set(self.window)
