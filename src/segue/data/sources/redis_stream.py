"""A Redis stream read through a consumer group, acknowledged only after the covering commit.

One consumer group per step (``group``, default ``segue-STEP``, created from
``start`` = ``"0"`` or ``"$"`` when absent) and one consumer per attempt whose
name is stable across the step's restarts (``RUN:STEP:w0``): a restarted
attempt finds its own pending entries again. An attempt reads in three phases:

1. its own pending entries (``XREADGROUP ... 0``): read by an attempt that
   died before the checkpoint covering them committed; processed again;
2. entries idle longer than ``claim_idle_ms`` in other consumers of the group
   (``XAUTOCLAIM``): consumers of runs that died;
3. new entries (``XREADGROUP ... >``) until the drain condition holds.

The position (in the step's checkpoint) names the messages read since the
last acknowledgement: the explicit ids of phases 1 and 2, and for phase 3 a
range ``(after, to]`` of ids (new entries arrive in id order), so it stays
O(1). ``XACK`` runs in :meth:`after_commit`, once the checkpoint recording
that position committed and the sinks published its outputs: for a position
of its own the attempt acks the range's ids it kept in memory (one pipelined
``XACK``); on restore the driver calls it with the restored position first,
whose range is read back from this consumer's pending list (``XPENDING``), so a
crash between the sink's commit and the ack acknowledges those messages
without processing them again.

Lag (:meth:`lag`, two round trips, at most every ``lag_every_s``): the group's
pending count (``XPENDING`` summary), its undelivered entries (``XINFO
GROUPS``' lag, or the stream's length when the group's last-delivered id lies
before the stream's first entry) and the age of the oldest entry not acked
(the oldest pending id, else the first undelivered one: an id is its time on
the server's clock, ``TIME``). What the stream keeps: ``retention_s`` or
``maxlen`` as the user states the producer's trimming, else what the stream
shows (entries added minus its length were deleted: the oldest entry's age
is how long one lasts). Entries trimmed before the group read them are counted
(entries added, minus entries the group read, minus what is left after its
last-delivered id) against the count its last position recorded: a rise is a
warning with the figures, never a silent loss.

A message delivered more than ``max_deliveries`` times (``XPENDING``'s
count), one that is not valid JSON, or one trimmed from the stream before it
was processed becomes a :class:`BadRecord`: the map step dead-letters it with
the reason, and it is acknowledged with its batch.

Unlike file sources this one holds a connection for the attempt and writes
to the broker (group creation, claims, acks); it is read by one process.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Any

from ..._faults import fault_point
from .._redis import connect, probe
from ..errors import DataError
from .base import BadRecord, Batch, Position
from .queue import QueueSource, decode_json, poison, span, with_id

PENDING_PAGE = 1000
ACK_PAGE = 10_000  # ids per XACK


def _sid(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


class RedisStreamSource(QueueSource):
    """Entries of the Redis stream ``stream`` at ``url`` (``redis://host:port/db``).

    Each entry's ``field`` (default ``"data"``) is decoded as JSON to give the
    record (``field=None``: the entry's fields as a dict); ``id_key`` adds the
    entry id to a dict record under that key. Drain: the step ends after
    ``max_messages`` in all, after ``drain_after_empty_reads`` reads in a row
    found nothing, or once nothing arrived for ``drain_idle_s`` seconds of
    ``clock`` (each empty read waits up to ``block_ms``); with all three None
    it reads until paused or cancelled (continuous).
    """

    kind = "redis-stream"
    shard_kind = "stream"

    def __init__(
        self,
        url: str,
        stream: str,
        *,
        group: str | None = None,
        start: str = "0",
        consumer: str | None = None,
        field: str | None = "data",
        id_key: str | None = None,
        block_ms: int = 1000,
        drain_idle_s: float | None = 10.0,
        drain_after_empty_reads: int | None = None,
        max_messages: int | None = None,
        max_deliveries: int = 5,
        claim_idle_ms: int | None = 300_000,
        create_stream: bool = False,
        retention_s: float | None = None,
        maxlen: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        lag_every_s: float = 5.0,
    ) -> None:
        if start not in ("0", "$"):
            raise ValueError(
                f"start must be '0' (the whole stream) or '$' (new entries only), not {start!r}"
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
        if retention_s is not None and retention_s <= 0:
            raise ValueError(f"retention_s must be > 0 seconds, not {retention_s}")
        if maxlen is not None and maxlen < 1:
            raise ValueError(f"maxlen must be >= 1 entries, not {maxlen}")
        self.retention_s, self.maxlen = retention_s, maxlen
        self.url, self.stream, self.group, self.start = url, stream, group, start
        self.consumer, self.field, self.id_key = consumer, field, id_key
        self.claim_idle_ms, self.create_stream = claim_idle_ms, create_stream
        self.acked = 0  # acknowledged by this attempt (after_commit)
        self._conn: Any = None
        self._me = ""
        self._n = 0
        self._ids: list[str] = []  # phases 1-2: read since the last ack
        self._after: str | None = None  # phase 3: (after, to] read since the last ack
        self._to: str | None = None
        self._reading = False  # read_from began: after_commit gets positions of this attempt
        self._new: list[str] = []  # phase 3: ids read since the last ack, in id order
        # Entries deleted after the group's last-delivered id, as last seen (a read past
        # them makes Redis count them read, and this 0 again).
        self._lost: int | None = None
        self._stopped_checked = False

    # -- the QueueSource contract -------------------------------------------------
    @property
    def input_name(self) -> str:
        return self.stream

    def start_position(self) -> Position:
        return {"records": 0, "ids": [], "after": None, "to": None, "at": None, "lost": None}

    def probe(self) -> None:
        """Refuse an unreachable server, a refused login or a missing stream (``segue run``)."""
        probe(self.url, self.stream, must_exist=not self.create_stream)

    # -- the attempt -------------------------------------------------------------
    @property
    def conn(self) -> Any:
        if self._conn is None:
            raise RuntimeError("RedisStreamSource used before attach()")
        return self._conn

    def attach(self, scope: Any) -> None:
        self.group = self.group or f"segue-{scope.step}"
        self._me = self.consumer or f"{scope.run_id}:{scope.step}:w{scope.worker or 0}"
        self._conn = connect(self.url, "RedisStreamSource")
        try:
            self._conn.xgroup_create(
                self.stream, self.group, id=self.start, mkstream=self.create_stream
            )
        except Exception as exc:  # redis.ResponseError; redis is imported lazily
            text = str(exc)
            if "BUSYGROUP" in text:
                return  # the group exists: its position is the broker's, not ours
            if "requires the key to exist" in text:
                raise DataError(
                    f"stream {self.stream!r} does not exist at {self.url}; check the name, "
                    f"or pass create_stream=True to wait for a producer"
                ) from None
            raise

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def after_commit(self, position: Position | None) -> None:
        fault_point("queue.before_ack")  # tests kill here: committed and published, not acked
        if position is None:
            return
        if self._lost is None and position.get("lost") is not None:
            self._lost = int(position["lost"])  # restored: the count its last read saw
        r, explicit, to = self.conn, list(position.get("ids") or ()), position.get("to")
        ids = explicit
        if self._reading and to is not None:
            # Our own position: this attempt read every new entry of its range and kept their
            # ids (in memory only): ack them without looking the range up in XPENDING.
            cut = bisect_right(self._new, _sid(to), key=_sid)
            ids = explicit + self._new[:cut]
            del self._new[:cut]
        if ids:
            pipe = r.pipeline(transaction=False)
            for i in range(0, len(ids), ACK_PAGE):
                pipe.xack(self.stream, self.group, *ids[i : i + ACK_PAGE])
            self.acked += sum(int(n) for n in pipe.execute())
        if to is not None and not self._reading:
            # Restored: the range's ids are known only to the group's pending list.
            after = position.get("after")
            lo = "-" if after is None else f"({after}"
            while True:
                got = r.xpending_range(
                    self.stream, self.group, lo, to, PENDING_PAGE, consumername=self._me
                )
                if not got:
                    break
                page = [e["message_id"] for e in got]
                self.acked += int(r.xack(self.stream, self.group, *page))
                lo = f"({page[-1]}"
        if explicit:
            done = set(explicit)
            self._ids = [i for i in self._ids if i not in done]
        if to is not None:
            self._after = to
            if self._to is not None and _sid(self._to) <= _sid(to):
                self._to = None
        fault_point("queue.after_ack")

    # -- reading -----------------------------------------------------------------
    def _position(self) -> Position:
        return {"records": self._n, "ids": list(self._ids), "after": self._after, "to": self._to,
                "at": round(self.wall(), 3), "lost": self._lost}

    def read_from(self, position: Position, batch: int) -> Iterator[Batch]:
        self._n = int(position.get("records", 0))
        self._check_stop(position)
        self._reading = True
        r, s, g, me = self.conn, self.stream, self.group, self._me
        cursor = "0"
        while True:  # 1. our own pending entries: read before the crash, never committed
            got = r.xreadgroup(g, me, {s: cursor}, count=batch)
            entries = got[0][1] if got else []
            if not entries:
                break
            cursor = entries[-1][0]
            yield self._batch(entries, self._deliveries([m for m, _ in entries]), explicit=True)
        if self.claim_idle_ms is not None:  # 2. entries of consumers that died
            start = "0-0"
            while True:
                start, entries, *rest = r.xautoclaim(
                    s, g, me, self.claim_idle_ms, start, count=batch
                )
                deleted: list[tuple[str, dict[str, str]]] = [
                    (m, {}) for m in (rest[0] if rest else [])
                ]  # trimmed: no longer pending
                if entries or deleted:
                    counts = self._deliveries([m for m, _ in entries])
                    yield self._batch(entries + deleted, counts, explicit=True)
                if start == "0-0":
                    break
        yield from self._read_new(batch)

    def _read_new(self, batch: int) -> Iterator[Batch]:
        """3. New entries, until the drain condition holds."""
        r = self.conn
        drain = self.drain()
        block = self.block_ms or None  # redis-py: block=0 would wait forever
        while count := drain.room(self._n, batch):
            got = r.xreadgroup(self.group, self._me, {self.stream: ">"}, count=count, block=block)
            entries = got[0][1] if got else []
            if entries:
                drain.arrived()
                yield self._batch(entries, {}, explicit=False)
                continue
            if drain.empty_read():
                return
            yield Batch([], self._position(), 0)  # the step may checkpoint or park while it waits

    def _deliveries(self, ids: list[str]) -> dict[str, int]:
        """How often each of our pending ``ids`` was delivered (this delivery included)."""
        if not ids:
            return {}
        want, out = set(ids), dict[str, int]()
        lo, hi = min(ids, key=_sid), max(ids, key=_sid)
        while True:
            got = self.conn.xpending_range(
                self.stream, self.group, lo, hi, PENDING_PAGE, consumername=self._me
            )
            out.update(
                (e["message_id"], int(e["times_delivered"])) for e in got if e["message_id"] in want
            )
            if len(got) < PENDING_PAGE:
                return out
            lo = f"({got[-1]['message_id']}"

    def _batch(
        self, entries: list[tuple[str, dict[str, str]]], deliveries: dict[str, int], explicit: bool
    ) -> Batch:
        records: list[Any] = []
        nbytes, bad = 0, False
        field, loads = self.field, json.loads
        # New entries are delivered once (never poison): JSON in the field is decoded here,
        # anything else (no field, bad JSON, an id to add) by _decode.
        fast = not deliveries and field is not None and self.id_key is None
        for mid, fields in entries:
            if fields:
                nbytes += sum(map(len, fields.values()))
                if fast and (text := fields.get(field or "")) is not None:
                    try:
                        records.append(loads(text))
                        continue
                    except ValueError:
                        pass
            rec = self._decode(mid, fields or {}, deliveries.get(mid, 1))
            bad = bad or type(rec) is BadRecord
            records.append(rec)
        if explicit:
            self._ids.extend(m for m, _ in entries)
        else:
            self._to = entries[-1][0]
            self._new.extend(m for m, _ in entries)
        self._n += len(entries)
        return Batch(records, self._position(), nbytes, has_bad=bad)

    def _decode(self, mid: str, fields: dict[str, str], deliveries: int) -> Any:
        if not fields:
            return BadRecord(
                json.dumps({"id": mid}),
                f"message {mid} was trimmed from stream {self.stream!r} before it was processed",
            )
        if deliveries > self.max_deliveries:
            raw = json.dumps({"id": mid, "fields": fields})
            return poison(raw, f"message {mid}", deliveries, self.max_deliveries)
        if self.field is None:
            rec: Any = dict(fields)
        elif self.field not in fields:
            return BadRecord(
                json.dumps({"id": mid, "fields": fields}),
                f"message {mid} has no field {self.field!r}",
            )
        else:
            rec = decode_json(fields[self.field], f"message {mid}: field {self.field!r}")
            if type(rec) is BadRecord:
                return rec
        return with_id(rec, self.id_key, mid)

    def describe(self) -> str:
        return f"redis stream {self.stream!r} (group {self.group}) at {self.url}"

    # -- lag and retention -------------------------------------------------------
    def lag(self) -> dict[str, Any]:
        r, s, g = self.conn, self.stream, self.group
        pipe = r.pipeline(transaction=False)
        pipe.time()
        pipe.xpending(s, g)
        pipe.xinfo_groups(s)
        pipe.xinfo_stream(s)
        (sec, usec), pend, groups, info = pipe.execute()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        grp = next((x for x in groups if x["name"] == g), None)
        if grp is None:
            return {"note": f"group {g} does not exist"}
        pending, last = int(pend["pending"]), grp["last-delivered-id"]
        length, added = int(info["length"]), info.get("entries-added")
        first = info["first-entry"][0] if info.get("first-entry") else None
        gap = grp.get("lag")  # entries added after the group's last read (trimmed ones too)
        undelivered: int | None
        lost: int | None
        if first is not None and _sid(first) > _sid(last):
            undelivered = length  # every entry left comes after the group's last read
            lost = None if gap is None else max(0, int(gap) - length)
        else:
            undelivered = None if gap is None else int(gap)
            lost = 0  # nothing was trimmed past the group's last read
        oldest = pend["min"] if pending else None
        if oldest is None and undelivered != 0:
            nxt = r.xrange(s, f"({last}", "+", count=1)
            oldest = nxt[0][0] if nxt else None
        out: dict[str, Any] = {
            "pending": pending,
            "undelivered": undelivered,
            "oldest_age_s": None if oldest is None else max(0.0, (now_ms - _sid(oldest)[0]) / 1000),
            "deleted_unread": lost,
            **self._keeps(now_ms, first, info, length, added),
        }
        if lost is not None:  # entries deleted past the group's last read: it skips them
            if self._lost is not None and lost > self._lost:
                self.warn(
                    f"stream {s!r} was trimmed past what group {g} had read: {lost - self._lost} "
                    f"entries were deleted before this step read them and are lost; the stream "
                    f"keeps {out['keeps']}"
                )
            self._lost = lost
        return out

    def _keeps(
        self, now_ms: int, first: str | None, info: dict[str, Any], length: int, added: Any
    ) -> dict[str, Any]:
        """How long the stream keeps an entry: as the user states the producer's trimming,
        else as the stream shows it (deleted entries: its oldest entry's age)."""
        oldest_s = None if first is None else max(0.0, (now_ms - _sid(first)[0]) / 1000)
        if self.retention_s is not None:
            return {"keeps_s": float(self.retention_s),
                    "keeps": f"entries for {span(self.retention_s)} (retention_s)"}
        if self.maxlen is not None:
            last = info.get("last-entry")
            keeps_s = None
            if oldest_s is not None and last and length > 1:
                spread_s = (_sid(last[0])[0] - _sid(first or last[0])[0]) / 1000
                keeps_s = spread_s * self.maxlen / length  # at the rate of what it holds now
            about = "" if keeps_s is None else f", about {span(keeps_s)} at the current rate"
            return {"keeps_s": keeps_s, "keeps": f"the last {self.maxlen} entries (maxlen){about}"}
        deleted = None if added is None else int(added) - length
        if deleted:
            return {"keeps_s": oldest_s,
                    "keeps": f"about {span(oldest_s or 0)} of entries: it is trimmed ({deleted} "
                             f"deleted so far) and its oldest entry is that old"}
        return {"keeps_s": None, "keeps": "every entry: the stream has not been trimmed"}

    def _check_stop(self, position: Position) -> None:
        """A restored position older than what the stream is stated to keep: say what may
        be gone (an observed loss is counted by :meth:`lag` itself)."""
        stopped = self.stopped_for(position)
        if self._stopped_checked or stopped is None:
            return
        self._stopped_checked = True
        try:
            figure = self.lag_due(force=True)
        except Exception:  # noqa: BLE001 - the read will say what is wrong
            return
        if figure is None:
            return
        keeps_s = figure.get("keeps_s")
        if keeps_s is not None and stopped > keeps_s and (self.retention_s or self.maxlen):
            self.warn(
                f"stream {self.stream!r} keeps {figure['keeps']}, and this step last read from "
                f"it {span(stopped)} ago: entries added before it read them may have been "
                f"trimmed unprocessed"
            )
