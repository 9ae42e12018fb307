"""A Google Cloud Pub/Sub subscription, acknowledged only after the covering commit.

Synchronous pull, not streaming pull: segue's read loop is a generator that
takes exactly as many messages as it may (the drain rule's ``max_messages``,
the outstanding window) at a point of its choosing, and a pause must park
with nothing pulled and unprocessed. ``subscribe()``'s streaming pull pushes
messages into callbacks on its own threads at the server's pace and holds its
flow control until each message is acked, so it would need a buffer between
its threads and the loop and would lease messages the loop never reads. One
``pull`` per read maps onto the loop directly; the lease (below) is ours.

* **Acked after the commit.** :meth:`after_commit` acknowledges the messages
  the committed position covers (this attempt's pull sequence number names
  them), once the sinks published their outputs.
* **Deadlines extended.** A lease thread calls ``modify_ack_deadline`` every
  third of the ack deadline for every message pulled and not yet acked, so a
  long batch (GPU inference) is not redelivered while it runs. ``close``
  gives back (deadline 0) what no commit covers.
* **Dedup by message id.** Ack ids die with their deadline: after a crash
  every unacked message comes back, including those a committed checkpoint
  covers. As in the RabbitMQ source, the position keeps ``window`` (ids read
  since the last ack) and ``ledger`` (the last ``ledger_size`` ids whose
  outputs are published); a redelivered message in the ledger is acked
  without being processed.
* **Poison.** With a dead-letter policy on the subscription Pub/Sub counts
  deliveries (``delivery_attempt``); without one the position counts the
  pulls of each message, committed (``Batch.flush``) before the messages are
  processed, so one that kills every worker still reaches ``max_deliveries``.
  Such a message, or one whose data is not UTF-8 JSON, is a
  :class:`BadRecord` (dead-lettered by the map step, then acked).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..._faults import fault_point
from .._pubsub import (
    PROBE_TIMEOUT_S,
    SubscriptionInfo,
    client,
    describe,
    probe,
    subscription_path,
    translate,
    where,
)
from .base import BadRecord, Batch, Position
from .queue import QueueSource, body_record, span

log = logging.getLogger(__name__)
ACK_CHUNK = 1000  # ack ids per request: well under Pub/Sub's 512 KB request limit
# An empty pull is answered by the server after a few seconds (2 s on the emulator); ours
# waits that long past block_ms before it cancels (see _pull: a cancel has a cost).
PULL_SLACK_S = 5.0


class PubSubSource(QueueSource):
    """Messages of the Pub/Sub subscription ``subscription`` (a full path, or a name with
    ``project=``). ``emulator_host`` (``HOST:PORT``) reads from the emulator.

    Each message's data is decoded as UTF-8 JSON to give the record; ``id_key``
    adds the message id to a dict record under that key. At most
    ``max_outstanding`` messages are pulled and not yet acked; ``ack_deadline_s``
    (default: the subscription's) is the deadline the lease keeps extending.
    Drain: the step ends after ``max_messages`` in all, after
    ``drain_after_empty_reads`` empty pulls in a row, or once nothing arrived
    for ``drain_idle_s`` seconds of ``clock`` (an empty pull waits for the server's
    answer, at most ``block_ms`` + 5 s); all three None: it reads until paused or
    cancelled. An attempt after another one does not end a drain before one
    ack deadline has passed, so messages leased to a killed attempt come back
    first. ``wall`` is the wall clock positions are stamped with (the pause
    against the subscription's retention).
    """

    kind = "pubsub"
    shard_kind = "pubsub"

    def __init__(
        self,
        subscription: str,
        *,
        project: str | None = None,
        emulator_host: str | None = None,
        max_outstanding: int = 500,
        ack_deadline_s: int | None = None,
        id_key: str | None = None,
        block_ms: int = 1000,
        drain_idle_s: float | None = 10.0,
        drain_after_empty_reads: int | None = None,
        max_messages: int | None = None,
        max_deliveries: int = 5,
        ledger_size: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if max_outstanding < 1:
            raise ValueError(f"max_outstanding must be >= 1, not {max_outstanding}")
        if ledger_size < max_outstanding:
            raise ValueError(
                f"ledger_size must be at least max_outstanding ({max_outstanding}): the ledger "
                f"must hold a whole window, not {ledger_size}"
            )
        if ack_deadline_s is not None and not 10 <= ack_deadline_s <= 600:
            raise ValueError(f"ack_deadline_s must be within 10..600, not {ack_deadline_s}")
        super().__init__(
            block_ms=block_ms,
            drain_idle_s=drain_idle_s,
            drain_after_empty_reads=drain_after_empty_reads,
            max_messages=max_messages,
            max_deliveries=max_deliveries,
            clock=clock,
            wall=wall,
        )
        self.subscription, self.project = subscription, project
        self.emulator_host, self.max_outstanding = emulator_host, int(max_outstanding)
        self.ack_deadline_s, self.id_key, self.ledger_size = ack_deadline_s, id_key, int(ledger_size)
        self.wall = wall
        self.acked = 0  # messages acknowledged by this attempt
        self.dropped = 0  # redelivered messages whose outputs were already published
        self.extensions = 0  # modify_ack_deadline calls made by the lease
        self.redelivered = 0  # messages delivered again while this attempt held them
        self._sub: Any = None
        self._path = ""
        self._info: SubscriptionInfo | None = None
        self._token = ""  # names this attempt in positions: its ack ids are only ours
        self._grace_until = 0.0  # clock time before which a drain may not end
        self._n = self._seq = 0
        self._lock = threading.Lock()
        self._pending: list[tuple[int, str]] = []  # (pull seq, ack id), not yet acked
        self._lease: _Lease | None = None
        self._window: list[str] = []
        self._ledger: list[str] = []  # never mutated: replaced
        self._ledger_set: set[str] = set()
        self._counts: dict[str, int] = {}  # pulls per message, without a dead-letter policy
        self._warned = False

    # -- the QueueSource contract -------------------------------------------------
    @property
    def input_name(self) -> str:
        return subscription_path(self.subscription, self.project)

    def start_position(self) -> Position:
        return {"records": 0, "att": "", "seq": 0, "window": [], "ledger": [], "counts": {}}

    def probe(self) -> None:
        """Refuse an unreachable endpoint or a missing subscription (``segue run``)."""
        probe(self.input_name, self.emulator_host)

    @property
    def deadline_s(self) -> int:
        """The ack deadline the lease keeps (seconds)."""
        if self.ack_deadline_s is not None:
            return self.ack_deadline_s
        return self._info.ack_deadline_s if self._info is not None else 10

    # -- the attempt -------------------------------------------------------------
    def attach(self, scope: Any) -> None:
        self._path = self.input_name
        self._sub = client(self.emulator_host)
        self._info = describe(self._sub, self._path, self.emulator_host, PROBE_TIMEOUT_S)
        self._token = uuid.uuid4().hex[:16]
        if int(getattr(scope, "epoch", 1) or 1) > 1:
            # A killed attempt's messages stay leased until their deadline: wait them out.
            self._grace_until = self.clock() + self.deadline_s + 2.0
        self._lease = _Lease(self)
        self._lease.start()

    def close(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.stop()
        sub, self._sub = self._sub, None
        if sub is None:
            return
        with self._lock:
            back, self._pending = [a for _, a in self._pending], []
        try:
            # What no commit covers goes back now, not at its deadline (a delivery counted).
            for i in range(0, len(back), ACK_CHUNK):
                sub.modify_ack_deadline(
                    request={"subscription": self._path, "ack_ids": back[i : i + ACK_CHUNK],
                             "ack_deadline_seconds": 0},
                    timeout=PROBE_TIMEOUT_S,
                )
        except Exception:  # noqa: BLE001 - an endpoint gone: the deadline gives them back
            pass
        finally:
            sub.close()

    @contextmanager
    def _call(self) -> Iterator[None]:
        """A failed call is one line; an unreachable endpoint is retried by the engine."""
        from google.api_core import exceptions as gexc

        try:
            yield
        except gexc.GoogleAPIError as exc:
            raise translate(exc, self._path, self.emulator_host) from None

    def after_commit(self, position: Position | None) -> None:
        fault_point("queue.before_ack")  # tests kill here: committed and published, not acked
        if position is None:
            return
        self._load(position)  # its window's outputs are published: into the ledger
        self._warn_retention(position)
        if position.get("att") == self._token and self._sub is not None:
            seq = int(position.get("seq") or 0)
            with self._lock:
                done = [a for s, a in self._pending if s <= seq]
                self._pending = [(s, a) for s, a in self._pending if s > seq]
            self._ack(done)
            self.acked += len(done)
        covered = set(position.get("window") or ())
        self._window = [i for i in self._window if i not in covered]
        fault_point("queue.after_ack")

    def _ack(self, ack_ids: list[str]) -> None:
        with self._call():
            for i in range(0, len(ack_ids), ACK_CHUNK):
                self._sub.acknowledge(
                    request={"subscription": self._path, "ack_ids": ack_ids[i : i + ACK_CHUNK]},
                    timeout=PROBE_TIMEOUT_S * 3,
                )

    def _load(self, position: Position) -> None:
        """Merge the position's ledger and window (published) into ours; idempotent."""
        window = list(position.get("window") or ())
        base = position.get("ledger") or []
        if window or base is not self._ledger:
            merged = list(dict.fromkeys([*self._ledger, *base, *window]))[-self.ledger_size :]
            self._ledger, self._ledger_set = merged, set(merged)
        counts = {**(position.get("counts") or {}), **self._counts}
        self._counts = {k: v for k, v in counts.items() if k not in self._ledger_set}

    def _warn_retention(self, position: Position) -> None:
        """A restored position older than the subscription's retention: say what may be gone."""
        at, info = position.get("at"), self._info
        if self._warned or at is None or info is None or position.get("att") == self._token:
            return
        self._warned = True
        stopped = self.wall() - float(at)
        if stopped > info.retention_s:
            before = time.gmtime(self.wall() - info.retention_s)
            self.warn(
                f"subscription {self._path} retains unacknowledged messages for "
                f"{span(info.retention_s)}, and this step last read from it {span(stopped)} ago: "
                f"messages published before {time.strftime('%Y-%m-%d %H:%M:%SZ', before)} may "
                f"have been dropped by Pub/Sub unprocessed"
            )

    # -- reading -----------------------------------------------------------------
    def _position(self, seq: int | None = None) -> Position:
        return {
            "records": self._n,
            "att": self._token,
            "seq": self._seq if seq is None else seq,
            "window": list(self._window),
            "ledger": self._ledger,
            "counts": dict(self._counts),
            "at": round(self.wall(), 3),
        }

    def _outstanding(self) -> int:
        with self._lock:
            return len(self._pending)

    def read_from(self, position: Position, batch: int) -> Iterator[Batch]:
        if self._sub is None:
            raise RuntimeError("PubSubSource used before attach()")
        self._load(position)
        self._warn_retention(position)
        self._n, self._window = int(position.get("records", 0)), []
        drain = self.drain()
        while room := drain.room(self._n, batch):
            room = min(room, self.max_outstanding - self._outstanding())
            if room <= 0:
                # The window is full of what was read: only a commit (its ack) frees it.
                yield Batch([], self._position(), 0, flush=True)
                continue
            got = self._pull(room)
            if got:
                drain.arrived()
                yield from self._batches(got)
                continue
            if drain.empty_read() and self.clock() >= self._grace_until:
                return
            yield Batch([], self._position(), 0)  # the step may checkpoint or park while it waits

    def _pull(self, count: int) -> list[Any]:
        from google.api_core import exceptions as gexc

        try:
            with self._call():
                got = self._sub.pull(
                    request={"subscription": self._path, "max_messages": count},
                    timeout=self.block_ms / 1000 + PULL_SLACK_S,
                    retry=None,
                )
        except gexc.DeadlineExceeded:
            # A pull we cancel may have had messages on their way to us: leased to no one who
            # reads them, they come back at their deadline, so a drain may not end before.
            self._grace_until = max(self._grace_until, self.clock() + self.deadline_s + 2.0)
            return []
        return list(got.received_messages)

    def _batches(self, got: list[Any]) -> Iterator[Batch]:
        before = self._seq
        fresh: list[tuple[int, Any]] = []
        stale: list[str] = []
        window = set(self._window)
        with self._lock:
            for rm in got:
                mid = rm.message.message_id
                if mid in self._ledger_set:
                    stale.append(rm.ack_id)  # its output is published: ack, do not process
                    continue
                self._seq += 1
                self._pending.append((self._seq, rm.ack_id))
                if mid in window:
                    self.redelivered += 1
                    continue  # redelivered while we hold it: acked with the commit covering it
                window.add(mid)
                fresh.append((self._seq, rm))
        if stale:
            self._ack(stale)
            self.dropped += len(stale)
            self.acked += len(stale)
        if self._info is not None and self._info.dead_letter_max is None and fresh:
            # No delivery count from Pub/Sub: count the pulls, durably, before processing,
            # or a message that kills the worker every time would never reach max_deliveries.
            for _, rm in fresh:
                mid = rm.message.message_id
                self._counts[mid] = self._counts.get(mid, 0) + 1
            yield Batch([], self._position(seq=before), 0, flush=True)
        records: list[Any] = []
        nbytes, bad = 0, False
        for _, rm in fresh:
            rec = self._decode(rm)
            bad = bad or type(rec) is BadRecord
            records.append(rec)
            nbytes += len(rm.message.data)
            self._n += 1
            self._window.append(rm.message.message_id)
        yield Batch(records, self._position(), nbytes, has_bad=bad)

    def _deliveries(self, rm: Any) -> int:
        """How often this message was delivered, this delivery included."""
        if self._info is not None and self._info.dead_letter_max is not None:
            return max(int(rm.delivery_attempt or 1), 1)
        return self._counts.get(rm.message.message_id, 1)

    def _decode(self, rm: Any) -> Any:
        mid = rm.message.message_id
        return body_record(mid, bytes(rm.message.data), self._deliveries(rm), self.max_deliveries,
                           raw_key="data", id_key=self.id_key)

    def describe(self) -> str:
        return f"pubsub subscription {self.input_name!r} at {where(self.emulator_host)}"

    def lag(self) -> dict[str, Any]:
        """What this attempt holds (no call: Pub/Sub reports undelivered counts and the
        oldest unacked age only through Cloud Monitoring, which the emulator lacks)."""
        info = self._info
        return {
            "pending": self._outstanding(),
            "keeps_s": None if info is None else info.retention_s,
            "keeps": None if info is None else (
                f"unacknowledged messages for {span(info.retention_s)} (the subscription's "
                f"message_retention_duration)"),
            "note": "undelivered and oldest age: not available (Cloud Monitoring's "
                    "num_undelivered_messages and oldest_unacked_message_age)",
        }


class _Lease(threading.Thread):
    """Extends the ack deadline of every pulled, unacked message every third of it."""

    def __init__(self, src: PubSubSource) -> None:
        super().__init__(name="segue-pubsub-lease", daemon=True)
        self.src = src
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=PROBE_TIMEOUT_S * 2)

    def run(self) -> None:
        src = self.src
        while not self._stop_event.wait(src.deadline_s / 3):
            with src._lock:
                ack_ids = [a for _, a in src._pending]
            sub = src._sub
            if not ack_ids or sub is None:
                continue
            try:
                for i in range(0, len(ack_ids), ACK_CHUNK):
                    sub.modify_ack_deadline(
                        request={"subscription": src._path, "ack_ids": ack_ids[i : i + ACK_CHUNK],
                                 "ack_deadline_seconds": src.deadline_s},
                        timeout=PROBE_TIMEOUT_S,
                    )
                src.extensions += 1
            except Exception as exc:  # noqa: BLE001 - tried again in a third of a deadline
                log.warning("subscription %s: extending %d ack deadlines failed (%s); retrying",
                            src._path, len(ack_ids), exc)


