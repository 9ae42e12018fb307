"""A RabbitMQ queue read with manual acks, acknowledged only after the covering commit.

One channel per attempt consumes the queue with a prefetch window
(``basic_qos``): the broker hands out at most ``prefetch`` unacknowledged
messages. ``basic_ack(multiple=True)`` runs in :meth:`after_commit`, once the
checkpoint whose position covers the messages committed and the sinks
published their outputs, then a round trip on the channel (``basic_qos``
again) makes sure the broker handled it before more is read. When the window
is full and nothing is left to read, the source asks the driver for a commit
at once (``Batch.flush``), so a long ``checkpoint_every`` never stalls it.

Delivery tags die with the channel: after a crash (of the worker, of the
connection, of the broker) every unacknowledged message is delivered again,
including those whose outputs a committed checkpoint already covers. The
position therefore names messages by id (``message_id``, or the header
``id_header``): ``window`` holds the ids read since the last ack and
``ledger`` the ids of the last ``ledger_size`` messages whose outputs were
published. On restore the driver calls :meth:`after_commit` with the restored
position; its tags are dead, so its window joins the ledger and the
redelivered messages at the head of the queue that the ledger covers are
taken and acked at once (a step restored as done reads nothing more); any
redelivered later is dropped the same way (acked with the next batch, not
processed). Both are bounded (``prefetch``, ``ledger_size``), so the
position stays O(1) in the input.

Lag (:meth:`lag`): ``pending`` is this attempt's own count of messages
delivered and not acked; ``undelivered`` the queue's ready messages (a
passive declare); the oldest age is that of the oldest message held
unacknowledged, by its ``timestamp`` property (AMQP shows no age of a message
still in the queue). What the queue keeps: AMQP cannot read a queue's
arguments, so ``message_ttl_s`` / ``queue_expires_s`` state its
``x-message-ttl`` / ``x-expires``, and a per-message ``expiration`` seen on a
delivery counts too; a restored position older than that is a warning with
both figures.

A message delivered more than ``max_deliveries`` times (the quorum queue's
``x-delivery-count`` header; on a classic queue the redelivered flag counted
in the position, made durable by a commit before the message is processed),
one without an id, or one whose body is not UTF-8 JSON becomes a
:class:`BadRecord`: the map step dead-letters it with the reason, and it is
acknowledged with its batch.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..._faults import fault_point
from .._amqp import BrokerUnreachable, check_queue, connect, probe
from .._urls import redact
from .base import BadRecord, Batch, Position
from .queue import IdLedger, QueueSource, body_record, span

# One delivered message: (delivery tag, redelivered flag, properties, body).
Delivery = tuple[int, bool, Any, bytes]


class RabbitMQSource(QueueSource):
    """Messages of the RabbitMQ queue ``queue`` at ``url`` (``amqp://user:pw@host:port/vhost``).

    Each body is decoded as UTF-8 JSON to give the record; ``id_key`` adds the
    message id to a dict record under that key. The id is the message's
    ``message_id`` property, or its header ``id_header`` when set; publish
    with one (a message without is dead-lettered). Drain: the step ends
    after ``max_messages`` in all, after ``drain_after_empty_reads`` reads in
    a row found the queue empty, or once nothing arrived for ``drain_idle_s``
    seconds of ``clock`` (each empty read waits up to ``block_ms``); with all
    three None it reads until paused or cancelled (continuous).
    """

    kind = "rabbitmq"
    shard_kind = "amqp"

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        prefetch: int = 500,
        id_header: str | None = None,
        id_key: str | None = None,
        block_ms: int = 1000,
        drain_idle_s: float | None = 10.0,
        drain_after_empty_reads: int | None = None,
        max_messages: int | None = None,
        max_deliveries: int = 5,
        ledger_size: int = 10_000,
        message_ttl_s: float | None = None,
        queue_expires_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        lag_every_s: float = 5.0,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, not {prefetch}")
        if ledger_size < prefetch:
            raise ValueError(
                f"ledger_size must be at least prefetch ({prefetch}): the ledger must hold a "
                f"whole window, not {ledger_size}"
            )
        super().__init__(
            block_ms=block_ms,
            drain_idle_s=drain_idle_s,
            drain_after_empty_reads=drain_after_empty_reads,
            max_messages=max_messages,
            max_deliveries=max_deliveries,
            clock=clock,
            wall=wall,
            lag_every_s=lag_every_s,
        )
        for what, v in (("message_ttl_s", message_ttl_s), ("queue_expires_s", queue_expires_s)):
            if v is not None and v <= 0:
                raise ValueError(f"{what} must be > 0 seconds, not {v}")
        self.message_ttl_s, self.queue_expires_s = message_ttl_s, queue_expires_s
        self._expiration_s: float | None = None  # the shortest per-message expiration seen
        self._held: deque[tuple[int, float]] = deque()  # (tag, timestamp) held unacked, in order
        self._stopped_checked = False
        self.url, self.queue_name, self.prefetch = url, queue, int(prefetch)
        self.id_header, self.id_key, self.ledger_size = id_header, id_key, int(ledger_size)
        self.acked = 0  # messages acknowledged by this attempt (after_commit)
        self.dropped = 0  # redelivered messages whose outputs were already published
        self._conn: Any = None
        self._ch: Any = None
        self._lost: tuple[type[BaseException], ...] = ()
        self._token = ""  # names this attempt's channel in positions: tags are only valid on it
        self._inbox: deque[Delivery] = deque()
        self._qos = self.prefetch
        self._received = self._acked = self._tag = 0  # delivery tags on this channel
        self._n = 0
        self._ids = IdLedger(self.ledger_size)  # window, ledger, redelivery counts

    # -- the QueueSource contract -------------------------------------------------
    @property
    def input_name(self) -> str:
        return self.queue_name

    def start_position(self) -> Position:
        return {"records": 0, "chan": "", "tag": 0, "window": [], "ledger": [], "counts": {},
                "at": None}

    def probe(self) -> None:
        """Refuse an unreachable broker, refused credentials or a missing queue (``segue run``)."""
        probe(self.url, self.queue_name)

    # -- the attempt -------------------------------------------------------------
    def attach(self, scope: Any) -> None:
        import pika

        self._lost = (pika.exceptions.AMQPError,)
        self._conn = connect(self.url, "RabbitMQSource")
        check_queue(self._conn, self.url, self.queue_name)
        self._ch = self._conn.channel()
        self._token = uuid.uuid4().hex[:16]

    def close(self) -> None:
        conn, self._conn, self._ch = self._conn, None, None
        if conn is not None and conn.is_open:
            try:
                conn.close()  # what was delivered and not acked goes back to the queue
            except Exception:  # noqa: BLE001 - a broker already gone: nothing to give back
                pass

    @contextmanager
    def _broker(self) -> Iterator[None]:
        """A connection or channel lost mid-attempt is one line; the engine retries."""
        try:
            yield
        except self._lost as exc:
            why = f"{type(exc).__name__}: {exc}".rstrip(": ")
            raise BrokerUnreachable(
                f"lost the AMQP broker at {redact(self.url)} ({why}); the attempt is retried"
            ) from None

    def after_commit(self, position: Position | None) -> None:
        fault_point("queue.before_ack")  # tests kill here: committed and published, not acked
        if position is None:
            return
        self._ids.load(position)  # its window's outputs are published: into the ledger
        tag, ch = int(position.get("tag") or 0), self._ch
        if ch is not None and position.get("chan") == self._token and tag > self._acked:
            with self._broker():
                ch.basic_ack(delivery_tag=tag, multiple=True)
                ch.basic_qos(prefetch_count=self._qos)  # a round trip: the ack was handled
            self.acked += tag - self._acked
            self._acked = tag
            while self._held and self._held[0][0] <= tag:
                self._held.popleft()
        elif ch is not None and position.get("chan") != self._token and position.get("window"):
            if not self._received:  # restored: its tags died with the channel that read it
                with self._broker():
                    self._settle_restored()
        fault_point("queue.after_ack")

    def _settle_restored(self) -> None:
        """On restore: ack the redelivered messages the ledger covers, now.

        A step restored as done reads nothing more, so its last window (published,
        never acked: a crash after the final commit) is acknowledged here, not by a
        later batch. Redelivered messages come first in the queue: take them one by
        one until one the ledger does not cover, which goes back (``basic_nack``
        with requeue: a quorum queue counts that as a delivery), or none is left.
        """
        ch = self._ch
        while True:
            method, props, _ = ch.basic_get(self.queue_name, auto_ack=False)
            if method is None:
                break
            self._received = self._acked = self._tag = int(method.delivery_tag)
            mid = self._message_id(props)
            if mid is None or not self._ids.published(mid):
                ch.basic_nack(delivery_tag=method.delivery_tag, requeue=True)
                break
            ch.basic_ack(delivery_tag=method.delivery_tag)
            self.acked += 1
            self.dropped += 1
        if self._received:
            ch.basic_qos(prefetch_count=self._qos)  # a round trip: the acks were handled

    # -- reading -----------------------------------------------------------------
    def _position(self) -> Position:
        return {
            "records": self._n,
            "chan": self._token,
            "tag": self._tag,
            **self._ids.fields(),
            "at": round(self.wall(), 3),
        }

    def _on_message(self, ch: Any, method: Any, props: Any, body: bytes) -> None:
        self._inbox.append((method.delivery_tag, bool(method.redelivered), props, body))
        self._received = max(self._received, int(method.delivery_tag))

    def read_from(self, position: Position, batch: int) -> Iterator[Batch]:
        if self._ch is None:
            raise RuntimeError("RabbitMQSource used before attach()")
        self._ids.load(position)
        self._ids.restart()
        self._n = int(position.get("records", 0))
        self._check_stop(position)
        drain = self.drain()
        # Never take more than max_messages leaves: what is delivered and not read goes
        # back to the queue at the end, counted as a delivery.
        self._qos = drain.room(self._n, self.prefetch)
        if not self._qos:
            return
        with self._broker():
            self._ch.basic_qos(prefetch_count=self._qos)
            self._ch.basic_consume(self.queue_name, self._on_message, auto_ack=False)
        while count := drain.room(self._n, batch):
            with self._broker():
                got = self._take(count)
            if got:
                drain.arrived()
                yield from self._batches(got)
                continue
            if self._received - self._acked >= self._qos:
                # The window is full of what was read: only a commit (its ack) frees it.
                yield Batch([], self._position(), 0, flush=True)
                continue
            with self._broker():
                empty = self._queue_empty()
            if empty and drain.empty_read():
                return
            yield Batch([], self._position(), 0)  # the step may checkpoint or park while it waits

    def _take(self, count: int) -> list[Delivery]:
        conn = self._conn
        conn.process_data_events(0)
        if not self._inbox and self._received - self._acked < self._qos:
            conn.process_data_events(time_limit=self.block_ms / 1000)
        return [self._inbox.popleft() for _ in range(min(count, len(self._inbox)))]

    def _queue_empty(self) -> bool:
        """No message ready in the queue and none on its way to us.

        The passive declare is a round trip on the consuming channel: every
        delivery the broker sent before its reply has arrived once it returns.
        """
        ready = self._ch.queue_declare(self.queue_name, passive=True).method.message_count
        self._conn.process_data_events(0)
        return int(ready) == 0 and not self._inbox

    def _message_id(self, props: Any) -> str | None:
        if self.id_header is None:
            mid = props.message_id
        else:
            mid = (props.headers or {}).get(self.id_header)
        if isinstance(mid, bytes):
            mid = mid.decode("utf-8", "replace")
        return None if mid is None or mid == "" else str(mid)

    def _batches(self, got: list[Delivery]) -> Iterator[Batch]:
        ids = [self._message_id(props) for _, _, props, _ in got]
        # Classic queues carry no delivery count: count redeliveries in the position,
        # and commit the count before processing, or a message that kills the worker
        # every time would never reach max_deliveries.
        bumped = False
        for (_, redelivered, props, _), mid in zip(got, ids, strict=True):
            if redelivered and mid is not None and not self._ids.published(mid):
                if "x-delivery-count" not in (props.headers or {}):
                    self._ids.redelivered(mid)
                    bumped = True
        if bumped:
            yield Batch([], self._position(), 0, flush=True)
        records: list[Any] = []
        nbytes, bad = 0, False
        for (tag, _, props, body), mid in zip(got, ids, strict=True):
            self._tag = tag
            self._note_times(tag, props)
            if mid is not None and self._ids.seen(mid):
                self.dropped += 1  # its output is published: acked with this batch
                continue
            rec = self._decode(mid, tag, props, body)
            bad = bad or type(rec) is BadRecord
            records.append(rec)
            nbytes += len(body)
            self._n += 1
            if mid is not None:
                self._ids.read(mid)
        yield Batch(records, self._position(), nbytes, has_bad=bad)

    def _deliveries(self, mid: str | None, props: Any) -> int:
        """How often this message was delivered, this delivery included."""
        count = (props.headers or {}).get("x-delivery-count")
        header = 1 if count is None else int(count) + 1
        return max(header, self._ids.counts.get(mid, 1) if mid is not None else 1)

    def _decode(self, mid: str | None, tag: int, props: Any, body: bytes) -> Any:
        if mid is None:
            what = "message_id property" if self.id_header is None else f"header {self.id_header!r}"
            return BadRecord(
                body.decode("utf-8", "replace"),
                f"message (delivery tag {tag}) of queue {self.queue_name!r} has no {what}; "
                f"publish every message with one",
            )
        return body_record(mid, body, self._deliveries(mid, props), self.max_deliveries, raw_key="body",
                           id_key=self.id_key)

    def describe(self) -> str:
        return f"rabbitmq queue {self.queue_name!r} at {redact(self.url)}"

    # -- lag and retention -------------------------------------------------------
    def _note_times(self, tag: int, props: Any) -> None:
        ts = getattr(props, "timestamp", None)
        if ts:
            self._held.append((tag, float(ts)))
        exp = getattr(props, "expiration", None)
        if exp:
            try:
                secs = int(exp) / 1000
            except ValueError:
                return
            if self._expiration_s is None or secs < self._expiration_s:
                self._expiration_s = secs

    def _keeps(self) -> dict[str, Any]:
        stated = [
            (v, f"{span(v)} ({name})")
            for v, name in (
                (self.message_ttl_s, "message_ttl_s: the queue's x-message-ttl"),
                (self.queue_expires_s, "queue_expires_s: the queue's x-expires"),
                (self._expiration_s, "a message's expiration property"),
            )
            if v is not None
        ]
        if not stated:
            return {"keeps_s": None, "keeps": "messages until they are acked (no TTL stated or seen)"}
        keeps_s, words = min(stated)
        return {"keeps_s": float(keeps_s), "keeps": f"unacknowledged messages for {words}"}

    def lag(self) -> dict[str, Any]:
        ch = self._ch
        if ch is None:
            return {}
        with self._broker():
            ready = int(ch.queue_declare(self.queue_name, passive=True).method.message_count)
        return {
            "pending": max(0, self._received - self._acked),
            "undelivered": ready,
            "oldest_age_s": (
                None if not self._held else max(0.0, self.wall() - self._held[0][1])
            ),
            **self._keeps(),
            "note": "the oldest age is that of the oldest message held unacked (its timestamp "
                    "property); AMQP shows none for a message still in the queue",
        }

    def _check_stop(self, position: Position) -> None:
        """A restored position older than what the queue is stated to keep: say what may be
        gone (RabbitMQ drops expired messages, or dead-letters them to its DLX)."""
        stopped = self.stopped_for(position)
        if self._stopped_checked or stopped is None:
            return
        self._stopped_checked = True
        keeps = self._keeps()
        if keeps["keeps_s"] is not None and stopped > keeps["keeps_s"]:
            self.warn(
                f"queue {self.queue_name!r} keeps {keeps['keeps']}, and this step last read "
                f"from it {span(stopped)} ago: messages published before it read them may have "
                f"expired unprocessed (dropped, or moved to the queue's dead-letter exchange)"
            )
